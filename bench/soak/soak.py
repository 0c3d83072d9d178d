"""The soak driver behind bench/soak/run.sh: one sidecar on a private Redis
under steady load from ratekeeper-loadgen, with chaos on a schedule (Redis
restarts, killed clients, SIGHUPs, hostile clients), sampled every second.
Standard library only; the plot is hand-written SVG."""

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request

MAX_FRAME = 4 * 1024 * 1024
LIMIT = """
[[limits]]
name = "soak"
tokens_per_minute = 60000000
burst_tokens = 1000000
requests_per_minute = 6000000
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.socket = os.path.join(work, "rk.sock")
        self.redis_port = free_port()
        self.metrics_port = free_port()
        self.events = []  # (t, kind)
        self.samples = []
        self.loads = []
        self.hostile_counts = {"refused": 0, "opened": 0}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.redis = None
        self.t0 = time.monotonic()

    def now(self):
        return time.monotonic() - self.t0

    def event(self, kind):
        with self.lock:
            self.events.append((round(self.now(), 1), kind))

    # --- processes -------------------------------------------------------
    def start_redis(self):
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.work,
                "--logfile",
                os.path.join(self.work, "redis.log"),
            ]
        )
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.redis_port), 0.1).close()
                return
            except OSError:
                time.sleep(0.05)

    def start_daemon(self):
        config = os.path.join(self.work, "rk.toml")
        with open(config, "w") as f:
            f.write(
                f'[server]\nsocket = "{self.socket}"\n\n'
                f'[redis]\nurl = "redis://127.0.0.1:{self.redis_port}/0"\n'
                f'on_failure = "local"\nlocal_share = 1.0\n\n'
                f'[metrics]\nlisten = "127.0.0.1:{self.metrics_port}"\n'
                f"[leases]\nexpire_after_ms = 60000\n{LIMIT}"
            )
        self.daemon = subprocess.Popen(
            [self.args.daemon, "serve", "--config", config, "--log-level", "info"],
            stderr=open(os.path.join(self.work, "daemon.log"), "w"),  # noqa: SIM115 (the daemon writes it until it exits)
        )
        while not os.path.exists(self.socket):
            time.sleep(0.05)

    # --- load and chaos ----------------------------------------------------
    def loadgen(self, connections, seconds, release=True):
        command = [
            self.args.loadgen,
            "soak",
            "--socket",
            self.socket,
            "--connections",
            str(connections),
            "--seconds",
            str(seconds),
            "--max-wait",
            "200",
        ]
        if release:
            command.append("--release")
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def steady_load(self):
        """Four load generators at a time, each for 20 s, restarted as they end."""
        running = []
        while not self.stop.is_set():
            running = [p for p in running if p.poll() is None]
            while len(running) < 4:
                running.append(self.loadgen(random.choice([1, 4, 16, 32]), 20))
            time.sleep(0.5)
        for p in running:
            p.kill()

    def kill_clients(self):
        """Every 15 s a client that keeps its leases is killed mid-run."""
        while not self.stop.wait(15):
            victim = self.loadgen(8, 30, release=False)
            time.sleep(random.uniform(2, 6))
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self.event("client killed")

    def restart_redis(self):
        """Every 120 s Redis dies for 3 s."""
        while not self.stop.wait(120):
            self.redis.kill()
            self.redis.wait()
            self.event("redis down")
            time.sleep(3)
            self.start_redis()
            self.event("redis up")

    def sighup(self):
        while not self.stop.wait(30):
            self.daemon.send_signal(signal.SIGHUP)
            self.event("SIGHUP")

    def connect(self):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(self.socket)
        return s

    def hostile_round(self, kind):
        """One burst of hostile clients; returns when they are gone."""
        conns = []
        try:
            if kind == "silent":  # never say hello: closed by hello_timeout_ms
                conns = [self.connect() for _ in range(200)]
                time.sleep(12)
            elif kind == "half frames":  # budget, then Overloaded
                for _ in range(100):
                    s = self.connect()
                    conns.append(s)
                    try:
                        s.sendall(struct.pack("<I", MAX_FRAME) + bytes(MAX_FRAME // 2))
                    except OSError:
                        self.hostile_counts["refused"] += 1
                time.sleep(12)
            elif kind == "trickle":  # one byte a second: frame_timeout_ms
                conns = [self.connect() for _ in range(50)]
                for s in conns:
                    s.sendall(struct.pack("<I", 1000))
                for _ in range(12):
                    for s in conns:
                        with contextlib.suppress(OSError):
                            s.sendall(b"\0")
                    time.sleep(1)
            elif kind == "flood":  # beyond max_connections
                for _ in range(1500):
                    try:
                        conns.append(self.connect())
                    except OSError:
                        break
                time.sleep(3)
            elif kind == "garbage":
                for _ in range(100):
                    s = self.connect()
                    conns.append(s)
                    s.sendall(os.urandom(64))
                time.sleep(1)
        except OSError:
            pass
        self.hostile_counts["opened"] += len(conns)
        for s in conns:
            s.close()
        self.event(kind)

    def hostile_clients(self):
        kinds = ["silent", "half frames", "trickle", "flood", "garbage"]
        i = 0
        while not self.stop.wait(8):
            self.hostile_round(kinds[i % len(kinds)])
            i += 1

    # --- sampling ------------------------------------------------------------
    def metrics(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        values = {}
        try:
            body = urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            return values
        for line in body.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            base = name.split("{", 1)[0]
            with contextlib.suppress(ValueError):
                values[base] = values.get(base, 0.0) + float(value)
        return values

    def sample(self):
        pid = self.daemon.pid
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        m = self.metrics()
        self.samples.append(
            {
                "t": round(self.now(), 1),
                "rss_mib": round(rss, 1),
                "fds": fds,
                "leases": m.get("ratekeeper_leases_open", float("nan")),
                "connections": m.get("ratekeeper_connections_open", float("nan")),
                "acquires": m.get("ratekeeper_acquires_total", 0.0),
                "cpu_s": cpu,
            }
        )

    def run(self):
        self.start_redis()
        self.start_daemon()
        threads = [
            threading.Thread(target=f, daemon=True)
            for f in (
                self.steady_load,
                self.kill_clients,
                self.restart_redis,
                self.sighup,
                self.hostile_clients,
            )
        ]
        for t in threads:
            t.start()
        deadline = self.t0 + self.args.seconds
        while time.monotonic() < deadline and self.daemon.poll() is None:
            self.sample()
            time.sleep(max(0.0, 1 - (self.now() % 1)))
        self.stop.set()
        alive = self.daemon.poll() is None
        for t in threads:
            t.join(timeout=30)
        time.sleep(2)
        if alive:
            self.sample()  # after the load stopped
            self.daemon.send_signal(signal.SIGTERM)
            code = self.daemon.wait(timeout=30)
        else:
            code = self.daemon.returncode
        self.redis.kill()
        return alive, code


def plot(samples, events, path):
    """Four stacked panels over time, events as vertical lines."""
    panels = [
        ("rss_mib", "RSS (MiB)"),
        ("fds", "open fds"),
        ("leases", "leases open"),
        ("connections", "connections open"),
    ]
    width, panel_h, left, top = 900, 130, 70, 30
    t_max = max(s["t"] for s in samples) or 1
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{top + len(panels) * (panel_h + 30) + 20}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">ratekeeper soak: {t_max:.0f} s</text>',
    ]
    colors = {"redis down": "#d62728", "redis up": "#2ca02c", "SIGHUP": "#9467bd"}
    for i, (key, label) in enumerate(panels):
        y0 = top + i * (panel_h + 30)
        values = [s[key] for s in samples if s[key] == s[key]]
        v_max = max([*values, 1]) * 1.1

        def x(t):
            return left + (width - left - 20) * t / t_max

        def y(v, y0=y0, v_max=v_max):
            return y0 + panel_h - panel_h * v / v_max

        out.append(
            f'<rect x="{left}" y="{y0}" width="{width - left - 20}" height="{panel_h}" '
            'fill="none" stroke="#999"/>'
        )
        out.append(f'<text x="5" y="{y0 + 12}">{label}</text>')
        out.append(f'<text x="{left - 5}" y="{y0 + 10}" text-anchor="end">{v_max:.0f}</text>')
        out.append(f'<text x="{left - 5}" y="{y0 + panel_h}" text-anchor="end">0</text>')
        for t, kind in events:
            if kind in colors:
                out.append(
                    f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y0}" y2="{y0 + panel_h}" '
                    f'stroke="{colors[kind]}" stroke-opacity="0.5"/>'
                )
        points = " ".join(f"{x(s['t']):.1f},{y(s[key]):.1f}" for s in samples if s[key] == s[key])
        out.append(f'<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="1.2"/>')
    y_axis = top + len(panels) * (panel_h + 30) - 15
    for t in range(0, int(t_max) + 1, 60):
        out.append(
            f'<text x="{left + (width - left - 20) * t / t_max:.1f}" y="{y_axis}" '
            f'text-anchor="middle">{t} s</text>'
        )
    legend = "  ".join(f'<tspan fill="{c}">| {k}</tspan>' for k, c in colors.items())
    out.append(f'<text x="{left}" y="{y_axis + 15}">{legend}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--daemon", required=True)
    parser.add_argument("--loadgen", required=True)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        soak = Soak(args, work)
        alive, code = soak.run()
        with open(os.path.join(work, "daemon.log")) as daemon_log:
            log = daemon_log.read()
    samples = soak.samples
    with open(os.path.join(args.out, "samples.csv"), "w") as f:
        f.write(",".join(samples[0]) + "\n")
        for s in samples:
            f.write(",".join(str(v) for v in s.values()) + "\n")
    plot(samples, soak.events, os.path.join(args.out, "soak.svg"))
    during = samples[:-1] if alive else samples
    steady = [s for s in during if s["t"] >= 60]
    minute = [s for s in samples if 50 <= s["t"] <= 70]
    result = {
        "seconds": round(samples[-1]["t"]),
        "daemon_survived": alive,
        "exit_code_after_sigterm": code,
        "rss_mib_start": samples[0]["rss_mib"],
        "rss_mib_at_1_min": minute[0]["rss_mib"] if minute else None,
        "rss_mib_max": max(s["rss_mib"] for s in samples),
        "rss_mib_last_minute_max": max(s["rss_mib"] for s in during[-60:]),
        "rss_mib_after_load": samples[-1]["rss_mib"],
        "fds_max": max(s["fds"] for s in samples),
        "fds_after_load": samples[-1]["fds"],
        "leases_max": max(s["leases"] for s in during if s["leases"] == s["leases"]),
        "leases_after_load": samples[-1]["leases"],
        "acquires": samples[-1]["acquires"],
        "daemon_cpu_s": round(samples[-1]["cpu_s"], 1),
        "events": {
            k: sum(1 for _, e in soak.events if e == k) for k in sorted({e for _, e in soak.events})
        },
        "hostile_connections": soak.hostile_counts["opened"],
        "log_panics": log.count("panicked"),
        "log_errors": sum(1 for line in log.splitlines() if " ERROR " in line),
        "rss_mib_steady_min": min((s["rss_mib"] for s in steady), default=None),
    }
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
