"""TCP ping-pong between two mini-cluster nodes: the one-way latency of their link.

    python -m bench.link_pingpong serve PORT          # on one node
    python -m bench.link_pingpong ping HOST PORT      # on the other; prints one JSON line

Small messages (8 bytes, TCP_NODELAY) make the round trip all latency: the veth pair, the
bridge, each side's TCP stack and its wake-up. Half the median round trip is the latency per
message that the forecast's alpha-beta model takes.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time

MESSAGE = b"x" * 8
ROUND_TRIPS = 2000


def _recv_exactly(conn: socket.socket, size: int) -> None:
    got = 0
    while got < size:
        chunk = conn.recv(size - got)
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        got += len(chunk)


def serve(port: int) -> None:
    with socket.create_server(("", port)) as server:
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(ROUND_TRIPS + 100):
                _recv_exactly(conn, len(MESSAGE))
                conn.sendall(MESSAGE)


def ping(host: str, port: int) -> dict[str, float]:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        trips = []
        for i in range(ROUND_TRIPS + 100):
            start = time.perf_counter()
            conn.sendall(MESSAGE)
            _recv_exactly(conn, len(MESSAGE))
            if i >= 100:  # the first trips warm the path up
                trips.append(time.perf_counter() - start)
    median = statistics.median(trips)
    return {"round_trip_us": median * 1e6, "latency_us": median / 2 * 1e6,
            "round_trips": len(trips)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 2:
        serve(int(argv[1]))
        return 0
    if argv[:1] == ["ping"] and len(argv) == 3:
        print(json.dumps(ping(argv[1], int(argv[2]))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
