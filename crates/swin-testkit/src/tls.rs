//! Servers as managed ones run: TLS and a password, started by the test that needs them.
//! A CA and a server certificate for 127.0.0.1 are made here (rcgen: no openssl
//! command, no files checked in); [`TlsRedis`] is a redis-server that listens only on a
//! TLS port and knows one ACL user; [`TlsPostgres`] is a PostgreSQL with `ssl = on` that
//! lets a scram-sha-256 role in over TLS only.

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

use crate::{free_port, wait_for_port, ChildGuard};

/// The password of the servers' users.
pub const PASSWORD: &str = "s3cret-Pa55";

/// A CA, and a certificate it signed for 127.0.0.1 and localhost, in a temporary folder.
#[derive(Debug)]
pub struct TestCa {
    pub dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // names of their own: with rcgen's one default name for both, OpenSSL (redis-cli,
        // the cluster bus) takes the server certificate for self-signed
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "swin test CA");
        let ca = ca_params.self_signed(&ca_key).expect("ca");
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let cert = params.signed_by(&key, &ca, &ca_key).expect("certificate");
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        TestCa {
            ca_file: write("ca.pem", ca.pem()),
            cert_file: write("server.pem", cert.pem()),
            key_file: write("server.key", key.serialize_pem()),
            dir,
        }
    }
}

impl TestCa {
    /// A redis-server's options to serve TLS with this CA's certificate (clients need
    /// none of their own).
    pub fn redis_server_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        for (option, file) in [
            ("--tls-cert-file", &self.cert_file),
            ("--tls-key-file", &self.key_file),
            ("--tls-ca-cert-file", &self.ca_file),
        ] {
            args.push(option.into());
            args.push(file.into());
        }
        args.extend(["--tls-auth-clients".into(), "no".into()]);
        args
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// A redis-server listening on a TLS port only, whose `default` user is off and whose
/// user [`TlsRedis::USER`] has the password [`PASSWORD`].
#[derive(Debug)]
pub struct TlsRedis {
    pub ca: TestCa,
    pub port: u16,
    _server: ChildGuard,
}

impl TlsRedis {
    pub const USER: &'static str = "swin-app";

    pub fn start() -> TlsRedis {
        let ca = TestCa::new();
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--tls-port")
            .arg(port.to_string())
            .args(ca.redis_server_args())
            .arg("--dir")
            .arg(ca.dir.path())
            .args(["--user", "default", "off", "--user", Self::USER, "on"])
            .arg(format!(">{PASSWORD}"))
            .args(["~*", "&*", "+@all"])
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server (scripts/test installs it)");
        let server = ChildGuard(child);
        wait_for_port(port, Duration::from_secs(10));
        TlsRedis {
            ca,
            port,
            _server: server,
        }
    }

    /// `rediss://` with the user and without the password.
    pub fn url(&self) -> String {
        format!("rediss://{}@127.0.0.1:{}", Self::USER, self.port)
    }
}

/// A PostgreSQL of the test's own: `ssl = on`, and over TCP only `hostssl` with
/// scram-sha-256 for the role [`TlsPostgres::ROLE`] (password [`PASSWORD`]), which owns
/// the database [`TlsPostgres::DATABASE`]. Runs as the `postgres` user when the test
/// runs as root (PostgreSQL refuses root).
#[derive(Debug)]
pub struct TlsPostgres {
    pub ca: TestCa,
    pub port: u16,
    _server: ChildGuard,
}

impl TlsPostgres {
    pub const ROLE: &'static str = "swin_app";
    pub const DATABASE: &'static str = "swin_tls";

    pub async fn start() -> TlsPostgres {
        let ca = TestCa::new();
        let bin = pg_bin_dir();
        let data = ca.dir.path().join("data");
        let owner = server_user();
        if let Some((uid, gid)) = owner {
            for p in [ca.dir.path(), &ca.key_file, &ca.cert_file, &ca.ca_file] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
            }
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ca.key_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod key");
        let as_server = |cmd: &mut Command| {
            if let Some((uid, gid)) = owner {
                cmd.uid(uid).gid(gid);
            }
        };
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust"])
            .stdout(Stdio::null());
        as_server(&mut initdb);
        assert!(initdb.status().expect("initdb").success(), "initdb failed");
        let conf = format!(
            "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\npassword_encryption = 'scram-sha-256'\nfsync = off\n",
            ca.cert_file.display(),
            ca.key_file.display()
        );
        append(&data.join("postgresql.conf"), &conf);
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all postgres trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
        )
        .expect("pg_hba.conf");
        let port = free_port();
        let mut postgres = Command::new(bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .arg("-k")
            .arg(ca.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_server(&mut postgres);
        let server = ChildGuard(postgres.spawn().expect("start postgres"));
        wait_for_port(port, Duration::from_secs(20));
        Self::create_role(ca.dir.path(), port).await;
        TlsPostgres {
            ca,
            port,
            _server: server,
        }
    }

    /// The role and its database, made over the server's socket (trust for postgres
    /// only), once the server takes connections.
    async fn create_role(socket_dir: &std::path::Path, port: u16) {
        let admin = format!(
            "postgres://postgres@localhost/postgres?host={}&port={port}",
            socket_dir.display()
        );
        let mut tries = 0;
        let pool = loop {
            match sqlx::PgPool::connect(&admin).await {
                Ok(p) => break p,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("connect to the test's PostgreSQL: {e}"),
            }
        };
        for sql in [
            format!("CREATE ROLE {} LOGIN PASSWORD '{PASSWORD}'", Self::ROLE),
            format!("CREATE DATABASE {} OWNER {}", Self::DATABASE, Self::ROLE),
        ] {
            sqlx::query(&sql).execute(&pool).await.expect("set up");
        }
        pool.close().await;
    }

    /// The role's URL, without its password, over TLS with the server verified.
    pub fn url(&self) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{}?sslmode=verify-full",
            Self::ROLE,
            self.port,
            Self::DATABASE
        )
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open");
    f.write_all(text.as_bytes()).expect("append");
}

/// Debian's newest PostgreSQL binaries.
fn pg_bin_dir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's binaries (scripts/test installs them)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("postgres").exists())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop().expect("a PostgreSQL under /usr/lib/postgresql")
}

/// The `postgres` user's ids when the test runs as root; `None` otherwise.
fn server_user() -> Option<(u32, u32)> {
    let me = Command::new("id").arg("-u").output().expect("id");
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("id");
        assert!(
            out.status.success(),
            "a postgres user (Debian's package makes one)"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a number")
    };
    Some((id("-u"), id("-g")))
}
