//! Listening: a TCP address or a Unix socket, one thread per connection (each with its pool of
//! request workers), until [`Stopper::stop`] closes the listener and every connection.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::server::{serve_connection, Config, Export};

/// Where the server listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A TCP address, e.g. `127.0.0.1:10809`.
    Tcp(String),
    /// A Unix socket's path.
    Unix(PathBuf),
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// A connection's socket, kept to shut it down on stop.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// A bound listener, not yet serving.
pub struct Server {
    listener: Listener,
    stop: Arc<Stop>,
}

#[derive(Default)]
struct Stop {
    stopped: AtomicBool,
    /// Open connections, by number.
    conns: Mutex<Vec<(u64, Conn)>>,
}

/// Stops a running [`Server`] from another thread (a signal handler's).
#[derive(Clone)]
pub struct Stopper(Arc<Stop>);

impl Stopper {
    /// Stops accepting and closes every connection; [`Server::run`] returns.
    pub fn stop(&self) {
        self.0.stopped.store(true, Ordering::Release);
        for (_, c) in self.0.conns.lock().expect("connections lock").iter() {
            c.shutdown();
        }
    }
}

/// How often the accept loop looks whether it was stopped.
const POLL: Duration = Duration::from_millis(5);

impl Server {
    /// Binds `listen`. A Unix socket left by a server that is gone is replaced; one a live
    /// server listens on is not.
    pub fn bind(listen: &Listen) -> io::Result<Server> {
        let listener = match listen {
            Listen::Tcp(addr) => Listener::Tcp(TcpListener::bind(addr)?),
            Listen::Unix(path) => {
                if path.exists() {
                    if UnixStream::connect(path).is_ok() {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!("{}: a server already listens there", path.display()),
                        ));
                    }
                    std::fs::remove_file(path)?;
                }
                Listener::Unix(UnixListener::bind(path)?, path.clone())
            }
        };
        match &listener {
            Listener::Tcp(l) => l.set_nonblocking(true)?,
            Listener::Unix(l, _) => l.set_nonblocking(true)?,
        }
        Ok(Server { listener, stop: Arc::default() })
    }

    /// The address clients use: `nbd://HOST:PORT` or `nbd+unix:///?socket=PATH`.
    pub fn uri(&self) -> String {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().map(|a| format!("nbd://{a}")).unwrap_or_default(),
            Listener::Unix(_, p) => format!("nbd+unix:///?socket={}", p.display()),
        }
    }

    /// A handle that stops this server.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.stop.clone())
    }

    /// Serves `export` to every client that connects until stopped. A connection's error ends
    /// that connection only (and is told to `on_error`).
    pub fn run(&self, export: &dyn Export, config: &Config, on_error: &(dyn Fn(io::Error) + Sync)) -> io::Result<()> {
        std::thread::scope(|s| {
            let mut number = 0u64;
            while !self.stop.stopped.load(Ordering::Acquire) {
                let accepted = match &self.listener {
                    Listener::Tcp(l) => l.accept().and_then(|(c, _)| {
                        c.set_nonblocking(false)?;
                        c.set_nodelay(true)?;
                        Ok((Box::new(c.try_clone()?) as Box<dyn io::Read + Send>, Conn::Tcp(c)))
                    }),
                    Listener::Unix(l, _) => l.accept().and_then(|(c, _)| {
                        c.set_nonblocking(false)?;
                        Ok((Box::new(c.try_clone()?) as Box<dyn io::Read + Send>, Conn::Unix(c)))
                    }),
                };
                let (input, conn) = match accepted {
                    Ok(a) => a,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                        std::thread::sleep(POLL);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let output: Box<dyn io::Write + Send> = match &conn {
                    Conn::Tcp(c) => Box::new(c.try_clone()?),
                    Conn::Unix(c) => Box::new(c.try_clone()?),
                };
                let mut conns = self.stop.conns.lock().expect("connections lock");
                if self.stop.stopped.load(Ordering::Acquire) {
                    conn.shutdown();
                }
                number += 1;
                let me = number;
                conns.push((me, conn));
                drop(conns);
                std::thread::Builder::new().name("cairn-nbd-conn".into()).spawn_scoped(s, move || {
                    let output = io::BufWriter::with_capacity(256 * 1024, output);
                    if let Err(e) = serve_connection(io::BufReader::new(input), output, export, config) {
                        if e.kind() != io::ErrorKind::BrokenPipe && e.kind() != io::ErrorKind::ConnectionReset {
                            on_error(e);
                        }
                    }
                    self.stop.conns.lock().expect("connections lock").retain(|(n, _)| *n != me);
                })?;
            }
            Ok(())
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = &self.listener {
            let _ = std::fs::remove_file(path);
        }
    }
}
