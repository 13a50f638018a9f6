"""A TCP proxy in front of Redis that delays the traffic of chosen clients: the cluster chaos run's added latency
(this kernel has no netem). It runs in a container of the chaos cluster (deploy/chaos-cluster.yml), standard
library only, and forwards every connection to the upstream; each chunk a client in the settings file sends, and
each chunk sent back to it, waits the client's delay first.

    python3 delay_proxy.py --listen 0.0.0.0:6380 --upstream redis:6379 --settings /chaos/delay.json

The settings file, {"delay_ms": {"172.20.0.5": 300}}, is read again whenever it changes (every 0.2 s); a client
not in it, or no file, is not delayed. A connection the upstream refuses (Redis down) is closed at once.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time

CHUNK = 65536
RELOAD_S = 0.2


class Settings:
    def __init__(self, path: str):
        self.path, self.mtime, self.delay_ms = path, None, {}
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                mtime = os.stat(self.path).st_mtime_ns
                if mtime != self.mtime:
                    with open(self.path, encoding="utf-8") as f:
                        self.delay_ms = {str(k): float(v) for k, v in json.load(f).get("delay_ms", {}).items()}
                    self.mtime = mtime
                    print(f"delay-proxy: delays now {self.delay_ms}", flush=True)
            except (OSError, ValueError, AttributeError):
                pass
            time.sleep(RELOAD_S)

    def delay_s(self, ip: str) -> float:
        return self.delay_ms.get(ip, 0.0) / 1000.0


def pump(src: socket.socket, dst: socket.socket, settings: Settings, client_ip: str) -> None:
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            delay = settings.delay_s(client_ip)
            if delay > 0:
                time.sleep(delay)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        src.close()  # each socket is closed by the pump that reads it


def serve(listen: str, upstream: str, settings: Settings) -> None:
    host, port = listen.rsplit(":", 1)
    up_host, up_port = upstream.rsplit(":", 1)
    server = socket.create_server((host, int(port)), reuse_port=True, backlog=256)
    print(f"delay-proxy: {listen} -> {upstream}", flush=True)
    while True:
        client, (client_ip, _) = server.accept()
        try:
            up = socket.create_connection((up_host, int(up_port)), timeout=5)
            up.settimeout(None)
        except OSError:
            client.close()
            continue
        for a, b in ((client, up), (up, client)):
            threading.Thread(target=pump, args=(a, b, settings, client_ip), daemon=True).start()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--settings", required=True)
    args = p.parse_args()
    serve(args.listen, args.upstream, Settings(args.settings))


if __name__ == "__main__":
    main()
