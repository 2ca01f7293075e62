//! A network-partition lab on one Linux machine (root needed): a network namespace
//! joined to the host by two veth pairs, one leading to a Kafka-protocol broker (tansu)
//! and one to a CQL bridge (`fairway cql-bridge`, in front of the suite's database), both
//! listening on the host ends. Workers run on the host or inside the namespace
//! (`ip netns exec`); setting the namespace's end of a pair down cuts the workers inside
//! off from the broker, the store, or both, while the host keeps reaching them.
//!
//! Used by `fairway-bench bench partitions` and `tests/it_partitions.rs` (the scenario and its
//! counts: `netlab::scenario`). Everything the lab starts or creates (processes, the
//! namespace, the veth pairs) is removed when it is dropped, on every exit path.

pub mod runs;
pub mod scenario;

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("`{cmd}` failed: {message} (the partition lab needs root, iproute2's `ip` and veth support)")]
    Command { cmd: String, message: String },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{0}")]
    Failed(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}

/// What the lab runs: the broker and fairway binaries, the database the bridge fronts,
/// and a directory for logs and configuration.
#[derive(Debug, Clone)]
pub struct LabSetup {
    pub tansu: PathBuf,
    pub fairway: PathBuf,
    /// The CQL database (protocol v3, e.g. the local Cassandra), host:port.
    pub cassandra: String,
    pub dir: PathBuf,
}

/// A link of the namespace: to the broker or to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Broker,
    Store,
}

/// One veth pair: its host end (address the servers listen on) and namespace end.
struct Pair {
    host_if: String,
    ns_if: String,
    host_addr: Ipv4Addr,
    ns_addr: Ipv4Addr,
}

/// The running lab.
pub struct Lab {
    ns: String,
    pairs: [Pair; 2],
    broker: String,
    cql: String,
    dir: PathBuf,
    fairway: PathBuf,
    /// The broker and the bridge.
    servers: Vec<Child>,
    /// Worker processes: (name, inside the namespace, process).
    workers: Vec<(String, bool, Child)>,
}

/// Runs `ip ARGS...`, failing with its stderr.
fn ip(args: &[&str]) -> Result<(), LabError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| LabError::Command { cmd: format!("ip {}", args.join(" ")), message: e.to_string() })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: format!("ip {}", args.join(" ")),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// A free TCP port on `addr` (bound, then released for the server to take).
fn free_port(addr: Ipv4Addr) -> Result<u16, LabError> {
    let l = TcpListener::bind((addr, 0)).map_err(io(format!("finding a free port on {addr}")))?;
    Ok(l.local_addr().map_err(io("local address"))?.port())
}

/// Waits until something accepts connections at `addr`.
fn wait_listening(addr: &str, within: Duration, what: &str) -> Result<(), LabError> {
    let deadline = Instant::now() + within;
    let sock: std::net::SocketAddr = addr.parse().map_err(|_| LabError::Failed(format!("bad address {addr}")))?;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&sock, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(LabError::Failed(format!("{what} did not listen on {addr} within {within:?}")))
}

impl Lab {
    /// Creates the namespace and its two links, starts the broker and the bridge on the
    /// host ends and waits until both listen.
    pub fn start(setup: &LabSetup) -> Result<Lab, LabError> {
        let id: u32 = rand::random::<u32>() & 0xff_ffff;
        // Two /30 subnets in 10.(200..250).x.y, chosen at random: labs of concurrent runs
        // do not meet.
        let (a, b, c) = (200 + (id % 50) as u8, (id >> 8) as u8, ((id >> 16) as u8 % 32) * 8);
        let pair = |tag: &str, base: u8| Pair {
            host_if: format!("fw{tag}{id:06x}h"),
            ns_if: format!("fw{tag}{id:06x}n"),
            host_addr: Ipv4Addr::new(10, a, b, c + base + 1),
            ns_addr: Ipv4Addr::new(10, a, b, c + base + 2),
        };
        std::fs::create_dir_all(&setup.dir).map_err(io(format!("creating {}", setup.dir.display())))?;
        let mut lab = Lab {
            ns: format!("fwlab{id:06x}"),
            pairs: [pair("b", 0), pair("s", 4)],
            broker: String::new(),
            cql: String::new(),
            dir: setup.dir.clone(),
            fairway: setup.fairway.clone(),
            servers: Vec::new(),
            workers: Vec::new(),
        };
        // From here on, Drop removes whatever was made.
        ip(&["netns", "add", &lab.ns])?;
        ip(&["netns", "exec", &lab.ns, "ip", "link", "set", "lo", "up"])?;
        for p in &lab.pairs {
            ip(&["link", "add", &p.host_if, "type", "veth", "peer", "name", &p.ns_if])?;
            ip(&["link", "set", &p.ns_if, "netns", &lab.ns])?;
            ip(&["addr", "add", &format!("{}/30", p.host_addr), "dev", &p.host_if])?;
            ip(&["link", "set", &p.host_if, "up"])?;
            let ns_addr = format!("{}/30", p.ns_addr);
            ip(&["netns", "exec", &lab.ns, "ip", "addr", "add", &ns_addr, "dev", &p.ns_if])?;
            ip(&["netns", "exec", &lab.ns, "ip", "link", "set", &p.ns_if, "up"])?;
        }
        lab.start_servers(setup)?;
        Ok(lab)
    }

    fn start_servers(&mut self, setup: &LabSetup) -> Result<(), LabError> {
        let (b, s) = (self.pairs[0].host_addr, self.pairs[1].host_addr);
        self.broker = format!("{b}:{}", free_port(b)?);
        self.cql = format!("{s}:{}", free_port(s)?);
        let url = format!("tcp://{}", self.broker);
        let tansu = [
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--storage-engine",
            "memory://tansu/",
        ];
        let broker = self.spawn_logged("broker", Command::new(&setup.tansu).args(tansu))?;
        self.servers.push(broker);
        let bridge = ["cql-bridge", "--listen", &self.cql, "--upstream", &setup.cassandra];
        let bridge = self.spawn_logged("bridge", Command::new(&setup.fairway).args(bridge))?;
        self.servers.push(bridge);
        wait_listening(&self.broker, Duration::from_secs(20), "the lab's broker")?;
        wait_listening(&self.cql, Duration::from_secs(20), "the lab's CQL bridge")
    }

    /// Starts `cmd` with its output in `<dir>/<name>.log`.
    fn spawn_logged(&self, name: &str, cmd: &mut Command) -> Result<Child, LabError> {
        let log = std::fs::File::create(self.log_path(name)).map_err(io(format!("creating {name}.log")))?;
        let err = log.try_clone().map_err(io("log file"))?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(err).spawn().map_err(io(format!("starting {name}")))
    }

    /// The logs of worker `name`: its earlier runs' (before restarts), then the current.
    pub fn worker_logs(&self, name: &str) -> Vec<PathBuf> {
        let earlier = (1..).map(|n| self.log_path(&format!("{name}.run-{n}"))).take_while(|p| p.exists());
        earlier.chain([self.log_path(name)]).collect()
    }

    /// Where the lab keeps the log of process `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// The broker's address (host end of the broker link).
    pub fn broker(&self) -> &str {
        &self.broker
    }

    /// The CQL bridge's address (host end of the store link).
    pub fn cql(&self) -> &str {
        &self.cql
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The namespace's address on `link` (reachable from the host while that link is up).
    pub fn inside_addr(&self, link: Link) -> Ipv4Addr {
        self.pairs[if link == Link::Broker { 0 } else { 1 }].ns_addr
    }

    /// Cuts (`up = false`) or restores a link of the namespace.
    pub fn set_link(&self, link: Link, up: bool) -> Result<(), LabError> {
        let p = &self.pairs[if link == Link::Broker { 0 } else { 1 }];
        ip(&["netns", "exec", &self.ns, "ip", "link", "set", &p.ns_if, if up { "up" } else { "down" }])?;
        if up {
            // Setting the end down dropped its address's routes; up brings them back.
            let ns_addr = format!("{}/30", p.ns_addr);
            let _ = ip(&["netns", "exec", &self.ns, "ip", "addr", "replace", &ns_addr, "dev", &p.ns_if]);
        }
        Ok(())
    }

    /// Starts `fairway --config CONFIG worker --pools short` as worker `name`, inside the
    /// namespace or on the host, with `env`; its log in `<dir>/<name>.log`. Returns its pid.
    pub fn spawn_worker(
        &mut self,
        name: &str,
        inside: bool,
        config: &Path,
        env: &[(&str, &str)],
    ) -> Result<u32, LabError> {
        let mut cmd = if inside {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &self.ns]).arg(&self.fairway);
            c
        } else {
            Command::new(&self.fairway)
        };
        cmd.arg("--config").arg(config).args(["worker", "--pools", "short"]).env("NO_COLOR", "1");
        // The lab's config file decides where the services are: overrides from the
        // environment (a test suite's own services) must not reach the workers.
        for k in ["FAIRWAY_BROKERS", "FAIRWAY_KAFKA", "FAIRWAY_CQL", "FAIRWAY_KEYSPACE", "FAIRWAY_TOPIC_PREFIX"] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = self.spawn_logged(name, &mut cmd)?;
        let pid = child.id();
        self.workers.push((name.to_string(), inside, child));
        Ok(pid)
    }

    /// Worker `name`'s exit status, if it exited.
    pub fn exited(&mut self, name: &str) -> Option<ExitStatus> {
        let (_, _, c) = self.workers.iter_mut().find(|(n, _, _)| n == name)?;
        c.try_wait().ok().flatten()
    }

    /// Starts worker `name` again (same place, config and env) after it exited.
    pub fn restart_worker(&mut self, name: &str, config: &Path, env: &[(&str, &str)]) -> Result<u32, LabError> {
        let i = self
            .workers
            .iter()
            .position(|(n, _, _)| n == name)
            .ok_or_else(|| LabError::Failed(format!("no worker {name}")))?;
        let (_, inside, mut old) = self.workers.remove(i);
        let _ = old.kill();
        let _ = old.wait();
        // Every earlier run's log is kept: `<name>.run-1.log`, `<name>.run-2.log`, ...
        let runs = (1..).find(|n| !self.log_path(&format!("{name}.run-{n}")).exists()).unwrap_or(1);
        let _ = std::fs::rename(self.log_path(name), self.log_path(&format!("{name}.run-{runs}")));
        self.spawn_worker(name, inside, config, env)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, _, c) in &mut self.workers {
            let _ = c.kill();
            let _ = c.wait();
        }
        for c in &mut self.servers {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the namespace destroys its veth ends and with them the pairs; the host
        // ends are deleted too in case a pair never got its end moved in.
        let _ = ip(&["netns", "del", &self.ns]);
        for p in &self.pairs {
            let _ = ip(&["link", "del", &p.host_if]);
        }
    }
}
