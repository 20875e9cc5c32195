"""What the datasets share: finding, sharding, staging and checking files, the ``tf.data``
mechanics, preprocessing, manifests and statistics, and the errors and reports for the user."""
