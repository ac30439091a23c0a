//! Backend planning and the seed topology (pure functions, what `tandem check` prints).

#![allow(clippy::unwrap_used)] // tests may unwrap

use tandem_transport::TransportError;
use tandem_transport::plan::{BackendKind, TransportOverride, choose, plan};
use tandem_transport::topology::{Colocated, Device, GroupSpec, Placement};

fn p(host: &str, d: Device) -> Placement {
    Placement::new(host, d)
}

#[test]
fn auto_rules() {
    let g0 = p("a", Device::Cuda(0));
    let g0b = p("a", Device::Cuda(0));
    let g1 = p("a", Device::Cuda(1));
    let remote = p("b", Device::Cuda(0));
    let cpu = p("a", Device::Cpu);
    let cpu_remote = p("b", Device::Cpu);
    let auto = TransportOverride::Auto;
    let k = |a, b, cuda| choose(a, b, auto, cuda).unwrap().backend;
    // Same GPU: never NCCL, even with CUDA.
    assert_eq!(k(&g0, &g0b, true), BackendKind::Shm);
    assert_eq!(k(&g0, &g1, true), BackendKind::Nccl);
    assert_eq!(k(&g0, &g1, false), BackendKind::Shm);
    assert_eq!(k(&g0, &remote, true), BackendKind::Nccl);
    assert_eq!(k(&g0, &remote, false), BackendKind::Tcp);
    assert_eq!(k(&cpu, &cpu, true), BackendKind::Shm);
    assert_eq!(k(&cpu, &cpu_remote, true), BackendKind::Tcp);
    assert_eq!(k(&cpu, &g1, true), BackendKind::Shm);
}

#[test]
fn overrides() {
    let a = p("a", Device::Cuda(0));
    let same = p("a", Device::Cuda(0));
    let other = p("b", Device::Cuda(0));
    let tcp: TransportOverride = "tcp".parse().unwrap();
    assert_eq!(
        choose(&a, &same, tcp, true).unwrap().backend,
        BackendKind::Tcp
    );
    let shm: TransportOverride = "SHM".parse().unwrap();
    match choose(&a, &other, shm, true) {
        Err(TransportError::Invalid(m)) => assert!(m.contains("different hosts"), "{m}"),
        other => panic!("{other:?}"),
    }
    let nccl: TransportOverride = "nccl".parse().unwrap();
    assert!(matches!(
        choose(&a, &other, nccl, false),
        Err(TransportError::Unsupported(_))
    ));
    let c = choose(&a, &same, nccl, true).unwrap();
    assert_eq!(c.backend, BackendKind::Shm);
    assert!(c.reason.contains("NCCL refuses"));
    assert!(matches!(
        choose(&p("a", Device::Cpu), &other, nccl, true),
        Err(TransportError::Invalid(_))
    ));
    match "bogus".parse::<TransportOverride>() {
        Err(e) => assert!(
            e.to_string()
                .contains("\"auto\", \"shm\", \"tcp\", \"nccl\"")
        ),
        Ok(o) => panic!("parsed {o}"),
    }
}

#[test]
fn plan_errors_name_the_ranks() {
    let places = vec![
        p("a", Device::Cpu),
        p("a", Device::Cpu),
        p("b", Device::Cpu),
    ];
    match plan(&places, "shm".parse().unwrap(), false) {
        Err(TransportError::Invalid(m)) => assert!(m.starts_with("ranks 0 and 2"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn seed_topology_on_two_hosts() {
    // 4 trainers + 4 engines, 2 hosts x 2 GPUs; engine i and trainer i share GPU i.
    let topo = Colocated::new(4);
    let places = topo.placements(&["h0", "h1"], 2, true);
    assert_eq!(places[topo.engine(3)], places[topo.trainer(3)]);
    assert_eq!(places[3], p("h1", Device::Cuda(1)));
    let pl = plan(&places, TransportOverride::Auto, true).unwrap();
    for i in 0..4 {
        let (e, t) = topo.pair(i);
        assert_eq!(pl.backend(e, t), BackendKind::Shm, "pair {i}");
    }
    assert_eq!(pl.backend(0, 1), BackendKind::Nccl);
    assert_eq!(pl.backend(0, 2), BackendKind::Nccl);
    let trainers = pl.group(&GroupSpec {
        name: "trainers".into(),
        ranks: topo.trainer_ranks(),
    });
    assert_eq!(
        trainers.to_string(),
        "trainers [0, 1, 2, 3]: nccl (6 pairs)"
    );
    let pair = pl.group(&topo.groups()[3]);
    assert_eq!(pair.to_string(), "pair0 [4, 0]: shm (1 pair)");
    // Without CUDA the same job runs on shm within a host and tcp across.
    let cpu = plan(&places, TransportOverride::Auto, false).unwrap();
    let world = cpu.group(&topo.groups()[0]);
    assert_eq!(
        world.to_string(),
        "world [0, 1, 2, 3, 4, 5, 6, 7]: shm (12 pairs), tcp (16 pairs)"
    );
}

#[test]
fn device_parse() {
    assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
    assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
    assert!("gpu0".parse::<Device>().is_err());
}
