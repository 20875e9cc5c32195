"""tfscale's Keras callbacks, usable in any ``model.fit`` (one class per module)."""

from tfscale.callbacks.batch_norm import BatchNormStatistics
from tfscale.callbacks.broadcast import BroadcastInitialState
from tfscale.callbacks.checkpoint import Checkpoint
from tfscale.callbacks.chief_only import ChiefOnly
from tfscale.callbacks.ddl import DDLGlobalVariablesBroadcast, DDLMetricSync, check_ddl_order
from tfscale.callbacks.evaluation import Evaluation
from tfscale.callbacks.events import EpochEvents
from tfscale.callbacks.guard import TrainingGuard
from tfscale.callbacks.metric_average import MetricAverage
from tfscale.callbacks.profile import ProfileSteps
from tfscale.callbacks.progress import ProgressLogger
from tfscale.callbacks.step import optimizer_step
from tfscale.callbacks.step_summaries import StepSummaries
from tfscale.callbacks.target import TargetStop
from tfscale.callbacks.tensorboard import EpochTensorBoard
from tfscale.callbacks.throughput import ThroughputMeter
from tfscale.callbacks.warmup import LearningRateWarmup
from tfscale.callbacks.watchdog import StepWatchdog

__all__ = ["BatchNormStatistics", "BroadcastInitialState", "Checkpoint", "ChiefOnly",
           "DDLGlobalVariablesBroadcast", "DDLMetricSync", "EpochEvents", "EpochTensorBoard",
           "Evaluation",
           "LearningRateWarmup", "MetricAverage", "ProfileSteps", "ProgressLogger",
           "StepSummaries", "StepWatchdog", "TargetStop", "ThroughputMeter", "TrainingGuard",
           "check_ddl_order", "optimizer_step"]
