//! A network-partition lab on one Linux machine (root needed): a network namespace
//! joined to the host by two veth pairs, one leading to an Apache Kafka broker of the
//! lab's own (`scripts/services run kafka`) and one to a TCP forwarder in front of the
//! suite's CQL database (`forward`), both listening on the host ends. Workers run on the host or inside the namespace
//! (`ip netns exec`); setting the namespace's end of a pair down cuts the workers inside
//! off from the broker, the store, or both, while the host keeps reaching them.
//!
//! Used by `fairway-bench bench partitions` and `tests/it_partitions.rs` (the scenario and its
//! counts: `netlab::scenario`). Everything the lab starts or creates (processes, the
//! namespace, the veth pairs) is removed when it is dropped, on every exit path.

mod forward;
pub use forward::Forwarder;
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

/// What the lab runs: `scripts/services` (it runs the lab's broker), the fairway binary,
/// the CQL database the forwarder fronts, and a directory for logs and configuration.
#[derive(Debug, Clone)]
pub struct LabSetup {
    pub services: PathBuf,
    pub fairway: PathBuf,
    /// The CQL database (the suite's Cassandra, listening on 127.0.0.1), host:port.
    pub cql: String,
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
    /// The broker.
    servers: Vec<Child>,
    /// The CQL forwarder (stops when dropped).
    forwarder: Option<forward::Forwarder>,
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
            forwarder: None,
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
        let controller = free_port(b)?;
        let port = self.broker.rsplit(':').next().unwrap_or_default().to_string();
        let mut cmd = Command::new(&setup.services);
        cmd.args(["run", "kafka"])
            .env("FAIRWAY_SERVICES_DIR", self.dir.join("kafka"))
            .env("FAIRWAY_SERVICES_HOST", b.to_string())
            .env("FAIRWAY_KAFKA_PORT", &port)
            .env("FAIRWAY_KAFKA_CONTROLLER_PORT", controller.to_string())
            .env("FAIRWAY_KAFKA_HEAP", "384m")
            .env_remove("FAIRWAY_KAFKA_EXTRA")
            .env_remove("FAIRWAY_KAFKA_SCRAM");
        let broker = self.spawn_logged("broker", &mut cmd)?;
        self.servers.push(broker);
        let upstream = setup.cql.parse().map_err(|_| LabError::Failed(format!("bad CQL address {}", setup.cql)))?;
        let forwarder = forward::Forwarder::start((s, 0).into(), upstream).map_err(io("starting the CQL forwarder"))?;
        self.cql = forwarder.addr().to_string();
        self.forwarder = Some(forwarder);
        // The broker formats its storage, then starts: ~10 s on 2 cores.
        wait_listening(&self.broker, Duration::from_secs(90), "the lab's broker")?;
        self.wait_broker_started(Duration::from_secs(60))?;
        wait_listening(&self.cql, Duration::from_secs(20), "the lab's CQL forwarder")
    }

    /// Waits until the broker's log says it started (it listens a little before).
    fn wait_broker_started(&mut self, within: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + within;
        loop {
            let log = std::fs::read_to_string(self.log_path("broker")).unwrap_or_default();
            if log.contains("Kafka Server started") {
                return Ok(());
            }
            if let Some(status) = self.servers.first_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(LabError::Failed(format!(
                    "the lab's broker exited ({status}); see {}",
                    self.log_path("broker").display()
                )));
            }
            if Instant::now() > deadline {
                return Err(LabError::Failed(format!("the lab's broker did not start within {within:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What a worker's `scylla.address_map` needs: the database reports its address as
    /// 127.0.0.1 and the driver would go there; the lab's workers must use the forwarder.
    pub fn cql_address_map(&self) -> (String, String) {
        let port = self.cql.rsplit(':').next().unwrap_or_default();
        (format!("127.0.0.1:{port}"), self.cql.clone())
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

    /// The CQL forwarder's address (host end of the store link).
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

    /// Moves the calling thread into the namespace: the sockets it opens from then on, and
    /// those of the threads it starts (a Kafka client's), are inside, behind its links.
    pub fn enter_namespace(&self) -> Result<(), LabError> {
        use std::os::fd::AsRawFd;
        let path = format!("/run/netns/{}", self.ns);
        let file = std::fs::File::open(&path).map_err(io(format!("opening {path}")))?;
        // SAFETY: setns on a valid namespace descriptor affects only the calling thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(LabError::Io { what: format!("entering {path}"), source: std::io::Error::last_os_error() });
        }
        Ok(())
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
        self.forwarder = None;
        let _ = std::fs::remove_dir_all(self.dir.join("kafka"));
        // Deleting the namespace destroys its veth ends and with them the pairs; the host
        // ends are deleted too in case a pair never got its end moved in.
        let _ = ip(&["netns", "del", &self.ns]);
        for p in &self.pairs {
            let _ = ip(&["link", "del", &p.host_if]);
        }
    }
}
