#!/usr/bin/env python3
"""Opens N idle TCP connections to HOST:PORT and holds them, reporting how many the peer closes.

    scripts/open-connections.py HOST:PORT N SECONDS

Used to measure a server at its open-file limit (accept() failing with EMFILE) and whether idle
connections are ever closed (docs/resources.md). Prints one line per second: open, closed by peer.
"""
import select
import socket
import sys
import time


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    count, seconds = int(sys.argv[2]), float(sys.argv[3])
    socks = []
    for _ in range(count):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.setblocking(False)
        socks.append(s)
    closed = set()
    start = time.time()
    while time.time() - start < seconds:
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 1.0)
        for s in readable:
            try:
                if s.recv(65536) == b"":
                    closed.add(s)
            except OSError:
                closed.add(s)
        print(f"{time.time() - start:6.1f}s open {count - len(closed)} closed_by_peer {len(closed)}", flush=True)
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
