//! The test Redis Cluster forms for real — three primaries with a replica each, every
//! slot assigned, seen alike from every node — and leaves no process behind.

use swin_testkit::redis_cluster::RedisCluster;

#[test]
fn six_servers_form_three_primaries_with_a_replica_each() {
    let cluster = RedisCluster::start();
    for &p in &cluster.ports {
        let info = cluster.info(p);
        assert!(info.contains("cluster_state:ok"), "{p}: {info}");
        assert!(info.contains("cluster_known_nodes:6"), "{p}: {info}");
        assert!(info.contains("cluster_size:3"), "{p}: {info}");
    }
    let nodes = cluster.nodes(cluster.ports[0]);
    let role = |r: &str| nodes.lines().filter(|l| l.contains(r)).count();
    assert_eq!(role("master"), 3, "{nodes}");
    assert_eq!(role("slave"), 3, "{nodes}");
    let ports = cluster.ports.clone();
    cluster.stop();
    for p in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", p)).is_err(),
            "port {p} still answers after stop"
        );
    }
}
