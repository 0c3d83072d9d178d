//! The deployment artifacts never rot: the systemd unit and the Kubernetes
//! manifests agree with the configs they ship (socket path, drain timeout,
//! config file), and the command lines they run — `check-config`, `serve`,
//! the probes' `ping` — work with this binary against a real Redis.
//!
//! There is no YAML or unit-file parser among the dependencies, so the
//! manifests are read line by line: every value checked here sits on a line
//! of its own (`key: value`, `Key=value`, or a one-line `["a", "b"]` list), and
//! a missing line fails naming the file and what was looked for.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ratekeeper::config::{self, Config};
use support::redis::RedisServer;

const UNIT: &str = "systemd/ratekeeper.service";
const SYSTEMD_CONFIG: &str = "systemd/ratekeeper.toml";
const DEPLOYMENT: &str = "k8s/deployment.yaml";
const KUSTOMIZATION: &str = "k8s/kustomization.yaml";
const K8S_CONFIG: &str = "k8s/ratekeeper.toml";
const DOCKERFILE: &str = "k8s/Dockerfile";

/// Where both deployments put the socket.
const SOCKET: &str = "/run/ratekeeper/ratekeeper.sock";

/// How long a daemon may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .unwrap_or_else(|err| panic!("cannot read {relative}: {err}"))
}

fn load(relative: &str) -> Config {
    match config::load(Some(&repo_path(relative)), |_| None) {
        Ok(config) => config,
        Err(err) => panic!("{relative} does not validate:\n{err}"),
    }
}

/// Lines of `text` without comments and blank lines, trimmed.
fn content_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#') && !line.starts_with(';'))
}

// ---- systemd unit: `Key=value` lines ----------------------------------------

/// Every value of `key` in the unit, in order.
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    content_lines(unit)
        .filter_map(|line| line.split_once('='))
        .filter(|(k, _)| k.trim() == key)
        .map(|(_, value)| value.trim())
        .collect()
}

/// The one value of `key` in the unit.
fn unit_value<'a>(unit: &'a str, key: &str) -> &'a str {
    match unit_values(unit, key)[..] {
        [value] => value,
        [] => panic!("{UNIT}: no `{key}=` line"),
        ref several => panic!("{UNIT}: `{key}=` appears {} times", several.len()),
    }
}

/// A command line from the unit, split on whitespace (the unit quotes nothing).
fn unit_argv(unit: &str, key: &str) -> Vec<String> {
    let line = unit_value(unit, key);
    assert!(
        !line.contains(['"', '\'', '$', '%']),
        "{UNIT}: {key}= uses quoting or expansion, which this test does not model: {line}"
    );
    line.split_whitespace().map(str::to_owned).collect()
}

/// A systemd time span (`30`, `30s`, `1min 30s`, `500ms`) in seconds.
fn timespan_seconds(span: &str) -> f64 {
    span.split_whitespace()
        .map(|part| {
            let digits = part.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            let number: f64 = digits
                .parse()
                .unwrap_or_else(|_| panic!("{UNIT}: cannot read the time span {span:?}"));
            let scale = match &part[digits.len()..] {
                "" | "s" | "sec" => 1.0,
                "ms" | "msec" => 0.001,
                "m" | "min" => 60.0,
                unit => panic!("{UNIT}: time unit {unit:?} in {span:?} is not modelled here"),
            };
            number * scale
        })
        .sum()
}

/// An octal mode such as `0750`.
fn octal(text: &str, what: &str) -> u32 {
    u32::from_str_radix(text, 8).unwrap_or_else(|_| panic!("{what}: {text:?} is not octal"))
}

// ---- Kubernetes YAML: `key: value` lines ------------------------------------

/// The value of a `key: value` line (list dash allowed), or `None`.
fn yaml_entry<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let line = line.strip_prefix("- ").unwrap_or(line);
    line.strip_prefix(key)?
        .strip_prefix(':')
        .map(|value| value.trim().trim_matches('"'))
}

/// The value of the only `key:` line in the file.
fn yaml_value<'a>(file: &str, text: &'a str, key: &str) -> &'a str {
    let values: Vec<&str> = content_lines(text)
        .filter_map(|line| yaml_entry(line, key))
        .collect();
    match values[..] {
        [value] => value,
        [] => panic!("{file}: no `{key}:` line"),
        _ => panic!("{file}: `{key}:` appears {} times", values.len()),
    }
}

/// The value of the first `key:` line after the line `anchor`.
fn yaml_value_after<'a>(file: &str, text: &'a str, anchor: &str, key: &str) -> &'a str {
    let mut lines = content_lines(text).skip_while(|line| *line != anchor);
    assert!(lines.next().is_some(), "{file}: no line `{anchor}`");
    lines
        .find_map(|line| yaml_entry(line, key))
        .unwrap_or_else(|| panic!("{file}: no `{key}:` line after `{anchor}`"))
}

/// A one-line flow sequence of double-quoted strings: `["a", "b"]`.
fn flow_list(file: &str, value: &str) -> Vec<String> {
    let inner = value
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("{file}: expected a one-line [\"...\"] list, got {value}"));
    inner
        .split(',')
        .map(|item| {
            let item = item.trim();
            item.strip_prefix('"')
                .and_then(|rest| rest.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{file}: list item {item} is not a plain quoted string"))
                .to_owned()
        })
        .collect()
}

/// How many content lines are exactly `line`.
fn count_lines(text: &str, line: &str) -> usize {
    content_lines(text).filter(|l| *l == line).count()
}

// ---- running the binary the way the artifacts do ------------------------------

/// `argv` with the installed binary replaced by the one under test and the
/// installed paths replaced by the repository's files or temporary ones.
fn localize(argv: &[String], replacements: &[(&str, &Path)]) -> Command {
    let (binary, args) = argv.split_first().expect("a command");
    assert!(
        binary.ends_with("/ratekeeper"),
        "the command runs {binary}, not ratekeeper"
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_ratekeeper"));
    for arg in args {
        match replacements.iter().find(|(from, _)| arg == from) {
            Some((_, to)) => command.arg(to),
            None => command.arg(arg),
        };
    }
    command
        .env_remove("RATEKEEPER_CONFIG")
        .env_remove("RATEKEEPER_SOCKET")
        .env_remove("RATEKEEPER_REDIS_URL")
        .env_remove("RATEKEEPER_METRICS_LISTEN")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RATEKEEPER_LOG_FORMAT");
    command
}

fn run(mut command: Command) -> Output {
    command.output().expect("run ratekeeper")
}

fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} exited with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A `serve` started from an artifact's command line; killed on drop, its
/// log printed if the test failed.
struct Served {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Served {
    fn start(mut command: Command, dir: &Path, redis_url: &str) -> Served {
        let socket = dir.join("ratekeeper.sock");
        let log = dir.join("daemon.log");
        let child = command
            .env(config::ENV_SOCKET, &socket)
            .env(config::ENV_REDIS_URL, redis_url)
            // Any free port: tests run side by side.
            .env(config::ENV_METRICS_LISTEN, "127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn ratekeeper serve");
        let mut served = Served { child, socket, log };
        let deadline = Instant::now() + START_TIMEOUT;
        while std::os::unix::net::UnixStream::connect(&served.socket).is_err() {
            if let Some(status) = served.child.try_wait().expect("poll daemon") {
                panic!("serve exited with {status} before listening");
            }
            assert!(Instant::now() < deadline, "serve did not listen in time");
            std::thread::sleep(Duration::from_millis(10));
        }
        served
    }

    fn signal(&self, name: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{name} failed");
    }

    /// Waits until the daemon's log contains `text`.
    fn wait_for_log(&self, text: &str) {
        let deadline = Instant::now() + START_TIMEOUT;
        while !std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains(text)
        {
            assert!(
                Instant::now() < deadline,
                "the daemon never logged {text:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The metrics listener's address, as the daemon logged it.
    fn metrics_address(&self) -> String {
        self.wait_for_log("serving /metrics");
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let line = log.lines().find(|line| line.contains("serving /metrics"));
        support::listen_address(line.expect("the line just seen"))
    }

    /// SIGTERM, as systemd's KillSignal and the kubelet send it; the exit
    /// status, which must come within `grace`.
    fn terminate(&mut self, grace: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        let deadline = Instant::now() + grace;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll daemon") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "serve still running {grace:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- daemon log ---\n{log}--- end of daemon log ---");
        }
    }
}

/// Acquires and settles through the CLI, and checks that Redis saw it.
fn assert_shares_buckets_through(served: &Served, redis: &RedisServer) {
    let output = run({
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratekeeper"));
        command
            .args([
                "acquire",
                "gpt-4o-mini",
                "--tokens",
                "100",
                "--report",
                "60",
            ])
            .arg("--socket")
            .arg(&served.socket);
        command
    });
    assert_success(&output, "ratekeeper acquire");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("granted"), "{stdout}");
    // One EVALSHA for the acquire at least (under the openai preset the
    // report keeps the charge and changes no bucket): the buckets live in
    // the Redis named by RATEKEEPER_REDIS_URL, not in the config file's url
    // (which points at a host that does not exist here).
    assert!(
        redis.command_calls("evalsha") >= 1,
        "the acquire did not reach Redis"
    );
}

// ---- the systemd unit ---------------------------------------------------------

#[test]
fn unit_validates_the_file_it_serves() {
    let unit = read(UNIT);
    let pre = unit_argv(&unit, "ExecStartPre");
    let start = unit_argv(&unit, "ExecStart");
    assert_eq!(
        pre.len(),
        3,
        "{UNIT}: ExecStartPre= should be `BINARY check-config FILE`"
    );
    assert_eq!(pre[1], "check-config", "{UNIT}: ExecStartPre=");
    assert_eq!(
        start.len(),
        4,
        "{UNIT}: ExecStart= should be `BINARY serve --config FILE`"
    );
    assert_eq!(start[1..3], ["serve", "--config"], "{UNIT}: ExecStart=");
    assert_eq!(
        pre[0], start[0],
        "{UNIT}: ExecStartPre= and ExecStart= run different binaries"
    );
    assert!(
        pre[0].starts_with('/'),
        "{UNIT}: systemd needs an absolute path: {}",
        pre[0]
    );
    assert_eq!(
        pre[2], start[3],
        "{UNIT}: ExecStartPre= checks another file than ExecStart= serves"
    );
    // The README installs systemd/ratekeeper.toml under this name.
    assert_eq!(
        start[3], "/etc/ratekeeper/ratekeeper.toml",
        "{UNIT}: config path"
    );
}

#[test]
fn unit_agrees_with_its_config() {
    let unit = read(UNIT);
    let config = load(SYSTEMD_CONFIG);

    assert_eq!(
        config.server.socket,
        PathBuf::from(SOCKET),
        "{SYSTEMD_CONFIG}"
    );
    let runtime_dir = Path::new("/run").join(unit_value(&unit, "RuntimeDirectory"));
    assert_eq!(
        config.server.socket.parent(),
        Some(runtime_dir.as_path()),
        "{SYSTEMD_CONFIG}: the socket is not in the unit's RuntimeDirectory="
    );

    let drain = Duration::from_millis(config.server.drain_timeout_ms).as_secs_f64();
    let stop = timespan_seconds(unit_value(&unit, "TimeoutStopSec"));
    assert!(
        stop > drain,
        "{UNIT}: TimeoutStopSec= ({stop} s) must exceed {SYSTEMD_CONFIG}'s drain_timeout_ms ({drain} s), \
         or systemd kills the daemon mid-drain"
    );

    // The members of the service's group reach the socket, nobody else does.
    let socket_mode = config.server.socket_mode;
    assert_eq!(
        socket_mode & 0o060,
        0o060,
        "socket_mode must give the group read and write"
    );
    assert_eq!(
        socket_mode & 0o007,
        0,
        "socket_mode must give others nothing"
    );
    let dir_mode = octal(
        unit_value(&unit, "RuntimeDirectoryMode"),
        "RuntimeDirectoryMode=",
    );
    assert_eq!(
        dir_mode & 0o010,
        0o010,
        "{UNIT}: the group must be able to enter {runtime_dir:?}"
    );
    assert_eq!(unit_value(&unit, "Group"), "ratekeeper", "{UNIT}: Group=");
    assert_eq!(unit_value(&unit, "User"), "ratekeeper", "{UNIT}: User=");
}

#[test]
fn unit_is_hardened_and_signals_as_the_daemon_expects() {
    let unit = read(UNIT);
    let expected = [
        ("Type", "notify"), // READY=1 once the socket listens
        ("KillSignal", "SIGTERM"),
        ("Restart", "on-failure"),
        ("EnvironmentFile", "-/etc/default/ratekeeper"),
        ("UMask", "0007"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("RestrictNamespaces", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("CapabilityBoundingSet", ""),
    ];
    for (key, value) in expected {
        assert_eq!(unit_value(&unit, key), value, "{UNIT}: {key}=");
    }
    assert_eq!(
        unit_values(&unit, "SystemCallFilter"),
        ["@system-service", "~@privileged @resources"],
        "{UNIT}: SystemCallFilter="
    );
    assert!(
        unit_value(&unit, "LimitNOFILE").parse::<u64>().unwrap_or(0) >= 4096,
        "{UNIT}: LimitNOFILE= should allow thousands of worker connections"
    );
    // `systemctl reload`: validate the file ExecStart= serves, then SIGHUP.
    assert_eq!(
        unit_values(&unit, "ExecReload"),
        [unit_value(&unit, "ExecStartPre"), "/bin/kill -HUP $MAINPID"],
        "{UNIT}: ExecReload= should check the config, then send SIGHUP"
    );
}

#[test]
fn unit_command_lines_work_with_this_binary() {
    let unit = read(UNIT);
    let config_path = repo_path(SYSTEMD_CONFIG);
    let installed_config = "/etc/ratekeeper/ratekeeper.toml";

    // ExecStartPre=, with the Redis URL from the EnvironmentFile=: valid, and
    // the password stays out of the journal.
    let mut pre = localize(
        &unit_argv(&unit, "ExecStartPre"),
        &[(installed_config, config_path.as_path())],
    );
    pre.env(
        config::ENV_REDIS_URL,
        "redis://:not-a-real-password@10.0.0.5:6379/0",
    );
    let output = run(pre);
    assert_success(&output, "the unit's ExecStartPre=");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        !printed.contains("not-a-real-password"),
        "check-config printed the password:\n{printed}"
    );
    assert!(
        printed.contains("10.0.0.5:6379"),
        "the environment's URL was not applied:\n{printed}"
    );

    // ExecStart=, socket moved to a temporary directory, against real Redis.
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut start = localize(
        &unit_argv(&unit, "ExecStart"),
        &[(installed_config, config_path.as_path())],
    );
    // Type=notify: systemd's socket hears READY=1 once the socket listens.
    let notify = dir.path().join("notify.sock");
    let systemd = std::os::unix::net::UnixDatagram::bind(&notify).expect("notify socket");
    systemd.set_read_timeout(Some(START_TIMEOUT)).unwrap();
    start.env("NOTIFY_SOCKET", &notify);
    let mut served = Served::start(start, dir.path(), &redis.url());
    let mut datagram = [0u8; 64];
    let len = systemd
        .recv(&mut datagram)
        .expect("READY=1 for Type=notify");
    assert!(datagram[..len].starts_with(b"READY=1\n"), "{datagram:?}");
    let mode = std::fs::metadata(&served.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660, "socket mode");
    assert_shares_buckets_through(&served, &redis);

    // `systemctl reload`: the check (ExecReload='s first line is
    // ExecStartPre=, see above), then SIGHUP; the daemon reloads and serves on.
    let check = localize(
        &unit_argv(&unit, "ExecStartPre"),
        &[(installed_config, config_path.as_path())],
    );
    assert_success(&run(check), "the unit's first ExecReload=");
    served.signal("HUP");
    served.wait_for_log("configuration reloaded");
    assert_shares_buckets_through(&served, &redis);

    let stop = Duration::from_secs_f64(timespan_seconds(unit_value(&unit, "TimeoutStopSec")));
    let status = served.terminate(stop);
    assert!(status.success(), "serve exited with {status} after SIGTERM");
    assert!(!served.socket.exists(), "the socket outlived the daemon");
}

/// `systemd-analyze verify` finds nothing wrong with the unit (the binary's
/// path replaced by the one under test). A missing `systemd-analyze` fails
/// the test rather than skipping it: `scripts/test` installs it.
#[test]
fn unit_passes_systemd_analyze_verify() {
    let version = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "systemd-analyze ({error}) is needed to verify {UNIT}: \
                 install it (Debian: apt-get install systemd) or run scripts/test"
            )
        });
    assert!(version.status.success());
    let dir = tempfile::tempdir().expect("temporary directory");
    let unit = read(UNIT).replace(
        "/usr/local/bin/ratekeeper",
        env!("CARGO_BIN_EXE_ratekeeper"),
    );
    let path = dir.path().join("ratekeeper.service");
    std::fs::write(&path, unit).unwrap();
    let output = run({
        let mut command = Command::new("systemd-analyze");
        command.arg("verify").arg(&path);
        command
    });
    assert_success(&output, "systemd-analyze verify");
    let complaints = String::from_utf8_lossy(&output.stderr);
    assert!(complaints.trim().is_empty(), "{complaints}");
}

// ---- the Kubernetes manifests -------------------------------------------------

/// The sidecar's `command` + `args`, as the kubelet runs them.
fn sidecar_argv(deployment: &str) -> Vec<String> {
    let anchor = "- name: ratekeeper";
    let mut argv = flow_list(
        DEPLOYMENT,
        yaml_value_after(DEPLOYMENT, deployment, anchor, "command"),
    );
    argv.extend(flow_list(
        DEPLOYMENT,
        yaml_value_after(DEPLOYMENT, deployment, anchor, "args"),
    ));
    argv
}

fn probe_argv(deployment: &str, probe: &str) -> Vec<String> {
    flow_list(
        DEPLOYMENT,
        yaml_value_after(DEPLOYMENT, deployment, &format!("{probe}:"), "command"),
    )
}

/// The probe that runs a command; the others ask the metrics listener.
const EXEC_PROBE: &str = "startupProbe";
/// The HTTP probes and the path each asks for.
const HTTP_PROBES: [(&str, &str); 2] =
    [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")];

/// The lines of the sidecar's definition: from `initContainers:` to `containers:`.
fn sidecar_block(deployment: &str) -> String {
    let block: Vec<&str> = content_lines(deployment)
        .skip_while(|line| *line != "initContainers:")
        .take_while(|line| *line != "containers:")
        .collect();
    assert!(
        !block.is_empty(),
        "{DEPLOYMENT}: no initContainers: section"
    );
    block.join("\n")
}

#[test]
fn k8s_manifests_agree_with_their_config() {
    let deployment = read(DEPLOYMENT);
    let config = load(K8S_CONFIG);
    assert_eq!(config.server.socket, PathBuf::from(SOCKET), "{K8S_CONFIG}");
    assert!(
        config.redis.is_some(),
        "{K8S_CONFIG}: the sidecars must share buckets through Redis"
    );

    // The socket volume is mounted where the config puts the socket, in the
    // sidecar and in the app.
    let socket_dir = config.server.socket.parent().unwrap().to_str().unwrap();
    let lines: Vec<&str> = content_lines(&deployment).collect();
    let socket_mounts: Vec<&str> = lines
        .windows(2)
        .filter(|pair| pair[0] == "- name: ratekeeper-socket")
        .filter_map(|pair| yaml_entry(pair[1], "mountPath"))
        .collect();
    assert_eq!(
        socket_mounts,
        [socket_dir, socket_dir],
        "{DEPLOYMENT}: the ratekeeper-socket volume's mountPath in the sidecar and in the app"
    );
    assert_eq!(
        yaml_value_after(
            DEPLOYMENT,
            &deployment,
            "- name: RATEKEEPER_SOCKET",
            "value"
        ),
        SOCKET,
        "{DEPLOYMENT}: the app's RATEKEEPER_SOCKET"
    );

    // The startup probe pings the config's socket; the others ask the
    // metrics listener, whose port the container and the scrape annotations name.
    assert_eq!(
        probe_argv(&deployment, EXEC_PROBE)[1..],
        ["ping", "--socket", SOCKET],
        "{DEPLOYMENT}: {EXEC_PROBE} must ping {K8S_CONFIG}'s socket"
    );
    let listen = config
        .metrics
        .listen
        .unwrap_or_else(|| panic!("{K8S_CONFIG}: [metrics] listen is needed by the HTTP probes"));
    assert!(
        listen.ip().is_unspecified(),
        "{K8S_CONFIG}: the kubelet probes the pod's IP"
    );
    let port = listen.port().to_string();
    for (probe, path) in HTTP_PROBES {
        let anchor = format!("{probe}:");
        assert_eq!(
            yaml_value_after(DEPLOYMENT, &deployment, &anchor, "path"),
            path,
            "{probe}"
        );
        assert_eq!(
            yaml_value_after(DEPLOYMENT, &deployment, &anchor, "port"),
            "metrics",
            "{probe}"
        );
    }
    assert_eq!(
        yaml_value_after(DEPLOYMENT, &deployment, "- name: metrics", "containerPort"),
        port,
        "{DEPLOYMENT}: the metrics containerPort"
    );
    assert_eq!(
        yaml_value(DEPLOYMENT, &deployment, "prometheus.io/port"),
        port
    );
    assert_eq!(
        yaml_value(DEPLOYMENT, &deployment, "prometheus.io/scrape"),
        "true"
    );
    assert_eq!(
        yaml_value(DEPLOYMENT, &deployment, "prometheus.io/path"),
        "/metrics"
    );

    // The sidecar serves the ConfigMap generated from k8s/ratekeeper.toml.
    let argv = sidecar_argv(&deployment);
    assert_eq!(
        argv[1..4],
        ["serve", "--config", "/etc/ratekeeper/ratekeeper.toml"],
        "{DEPLOYMENT}: sidecar"
    );
    assert_eq!(
        yaml_value_after(
            DEPLOYMENT,
            &deployment,
            "- name: ratekeeper-config",
            "mountPath"
        ),
        "/etc/ratekeeper",
        "{DEPLOYMENT}: the config volume's mountPath"
    );
    assert_eq!(
        yaml_value_after(DEPLOYMENT, &deployment, "configMap:", "name"),
        "ratekeeper-config",
        "{DEPLOYMENT}: the config volume's ConfigMap"
    );
    let kustomization = read(KUSTOMIZATION);
    assert_eq!(
        yaml_value_after(KUSTOMIZATION, &kustomization, "configMapGenerator:", "name"),
        "ratekeeper-config"
    );
    let generated_from: Vec<&str> = content_lines(&kustomization)
        .skip_while(|line| *line != "configMapGenerator:")
        .filter_map(|line| line.strip_prefix("- "))
        .collect();
    assert!(
        generated_from.contains(&"ratekeeper.toml"),
        "{KUSTOMIZATION}: configMapGenerator must read ratekeeper.toml"
    );
    for resource in ["deployment.yaml", "redis.yaml"] {
        assert_eq!(
            count_lines(&kustomization, &format!("- {resource}")),
            1,
            "{KUSTOMIZATION}: {resource}"
        );
        assert!(
            repo_path("k8s").join(resource).exists(),
            "k8s/{resource} is missing"
        );
    }

    // Termination: the kubelet must not kill the sidecar mid-drain.
    let grace: f64 = yaml_value(DEPLOYMENT, &deployment, "terminationGracePeriodSeconds")
        .parse()
        .expect("terminationGracePeriodSeconds is a number");
    let drain = Duration::from_millis(config.server.drain_timeout_ms).as_secs_f64();
    assert!(
        grace > drain,
        "{DEPLOYMENT}: terminationGracePeriodSeconds ({grace}) must exceed {K8S_CONFIG}'s drain_timeout_ms ({drain} s)"
    );

    // The Redis URL (and its password) comes from the Secret.
    assert_eq!(
        yaml_value_after(
            DEPLOYMENT,
            &deployment,
            "- name: RATEKEEPER_REDIS_URL",
            "name"
        ),
        "ratekeeper-redis",
        "{DEPLOYMENT}: RATEKEEPER_REDIS_URL's secretKeyRef"
    );
}

#[test]
fn k8s_sidecar_is_native_and_hardened() {
    let deployment = read(DEPLOYMENT);
    // A native sidecar: an init container that keeps running.
    assert_eq!(
        yaml_value_after(DEPLOYMENT, &deployment, "initContainers:", "restartPolicy"),
        "Always",
        "{DEPLOYMENT}: ratekeeper must be a native sidecar"
    );
    assert_eq!(
        yaml_value_after(DEPLOYMENT, &deployment, "initContainers:", "name"),
        "ratekeeper"
    );
    assert_eq!(yaml_value(DEPLOYMENT, &deployment, "runAsNonRoot"), "true");
    assert_eq!(
        yaml_value_after(DEPLOYMENT, &deployment, "seccompProfile:", "type"),
        "RuntimeDefault"
    );
    // Per container: the sidecar and the app.
    for line in [
        "allowPrivilegeEscalation: false",
        "readOnlyRootFilesystem: true",
        "drop: [\"ALL\"]",
    ] {
        assert_eq!(
            count_lines(&deployment, line),
            2,
            "{DEPLOYMENT}: `{line}` in each container"
        );
    }
    // The socket's group is the pod's fsGroup, the sidecar's group too.
    let sidecar = sidecar_block(&deployment);
    let fs_group = yaml_value(DEPLOYMENT, &deployment, "fsGroup");
    assert_eq!(
        yaml_value(DEPLOYMENT, &sidecar, "runAsGroup"),
        fs_group,
        "{DEPLOYMENT}: the sidecar's runAsGroup"
    );
    for key in ["requests", "limits"] {
        assert_ne!(
            yaml_value_after(DEPLOYMENT, &sidecar, &format!("{key}:"), "memory"),
            "",
            "{DEPLOYMENT}: the sidecar's memory {key}"
        );
    }

    // The image runs the binary the probes call, as the sidecar's user.
    let dockerfile = read(DOCKERFILE);
    let entrypoint = content_lines(&dockerfile)
        .find_map(|line| line.strip_prefix("ENTRYPOINT "))
        .unwrap_or_else(|| panic!("{DOCKERFILE}: no ENTRYPOINT"));
    let binary = &sidecar_argv(&deployment)[0];
    assert_eq!(flow_list(DOCKERFILE, entrypoint), [binary.as_str()]);
    assert_eq!(
        &probe_argv(&deployment, EXEC_PROBE)[0],
        binary,
        "{DEPLOYMENT}: {EXEC_PROBE}"
    );
    let user = content_lines(&dockerfile)
        .filter_map(|line| line.strip_prefix("USER "))
        .last()
        .unwrap_or_else(|| panic!("{DOCKERFILE}: no USER"));
    let run_as = format!(
        "{}:{fs_group}",
        yaml_value(DEPLOYMENT, &sidecar, "runAsUser")
    );
    assert_eq!(
        user, run_as,
        "{DOCKERFILE}: USER vs the sidecar's runAsUser:fsGroup"
    );
}

#[test]
fn k8s_config_has_the_same_limits_as_the_systemd_one() {
    let k8s = load(K8S_CONFIG);
    let systemd = load(SYSTEMD_CONFIG);
    assert_eq!(k8s.limits, systemd.limits);
    assert_eq!(k8s.priorities, systemd.priorities);
    assert_eq!(k8s.default_priority, systemd.default_priority);
    assert_eq!(k8s.server.socket, systemd.server.socket);
}

#[test]
fn k8s_sidecar_command_and_probes_work_with_this_binary() {
    let deployment = read(DEPLOYMENT);
    let config_path = repo_path(K8S_CONFIG);

    let output = run({
        let mut command = localize(&sidecar_argv(&deployment)[..1], &[]);
        command.arg("check-config").arg(&config_path);
        command
    });
    assert_success(&output, "check-config k8s/ratekeeper.toml");

    // The container's command line, as the kubelet runs it (with the
    // ConfigMap's file and the socket volume replaced by local paths) and
    // the Secret's URL pointing at a real Redis.
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temporary directory");
    // The socket volume as the kubelet makes an emptyDir: mode 0777.
    let volume = dir.path().join("ratekeeper-socket");
    std::fs::create_dir(&volume).unwrap();
    std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o777)).unwrap();
    let serve = localize(
        &sidecar_argv(&deployment),
        &[("/etc/ratekeeper/ratekeeper.toml", config_path.as_path())],
    );
    let mut served = Served::start(serve, &volume, &redis.url());

    let output = run(localize(
        &probe_argv(&deployment, EXEC_PROBE),
        &[(SOCKET, served.socket.as_path())],
    ));
    assert_success(&output, EXEC_PROBE);
    let address = served.metrics_address();
    for (probe, path) in HTTP_PROBES {
        let answer = support::try_http_get(&address, path);
        assert_eq!(
            answer.as_ref().map(|(status, _)| *status),
            Some(200),
            "{probe}: {answer:?}"
        );
    }
    assert_shares_buckets_through(&served, &redis);

    let grace = yaml_value(DEPLOYMENT, &deployment, "terminationGracePeriodSeconds");
    let status = served.terminate(Duration::from_secs(grace.parse().unwrap()));
    assert!(status.success(), "serve exited with {status} after SIGTERM");

    // The daemon removed its socket and closed its listener: the probes
    // fail from then on.
    let output = run(localize(
        &probe_argv(&deployment, EXEC_PROBE),
        &[(SOCKET, served.socket.as_path())],
    ));
    assert!(
        !output.status.success(),
        "{EXEC_PROBE} passes after SIGTERM"
    );
    assert_eq!(
        support::try_http_get(&address, "/readyz"),
        None,
        "readinessProbe passes after SIGTERM"
    );
}
