//! Shrinking: a run that found violations is run again with the same seed and fewer
//! clients, then fewer seconds, keeping each smaller run that still shows a violation of
//! the same check, until the runs allowed (`--shrink-runs`) are spent or nothing smaller
//! is left (one client, five seconds). The last run that still showed it is the shortest
//! history printed.

use crate::run::{print, print_violation, run_once, Options, Ran};

/// Runs, checks and prints, shrinking a run with violations; whether none was found.
pub async fn run_and_shrink(o: &Options) -> bool {
    let ran = run_once(o).await;
    print(&ran);
    if ran.report.violations.is_empty() {
        return true;
    }
    shrink(o, &ran).await;
    false
}

/// The next smaller options to try after `o`: fewer clients first, then fewer seconds.
pub fn smaller(o: &Options, clients_failed: bool) -> Option<Options> {
    let mut next = o.clone();
    if o.clients > 1 && !clients_failed {
        next.clients = o.clients / 2;
    } else if o.seconds > 5 {
        next.seconds = (o.seconds / 2).max(5);
    } else {
        return None;
    }
    Some(next)
}

/// Shrinks `first`'s violations (run with `o`) and prints the shortest history found.
pub async fn shrink(o: &Options, first: &Ran) {
    let checks: Vec<&str> = first.report.violations.iter().map(|v| v.check).collect();
    let mut best = o.clone();
    let mut best_ran: Option<Ran> = None;
    let mut clients_failed = false;
    for _ in 0..o.shrink_runs {
        let Some(next) = smaller(&best, clients_failed) else {
            break;
        };
        println!(
            "shrink: the seed again with --clients {} --seconds {}",
            next.clients, next.seconds
        );
        let ran = run_once(&next).await;
        let shows = ran
            .report
            .violations
            .iter()
            .any(|v| checks.contains(&v.check));
        println!(
            "shrink: ops {}, violations {}{}",
            ran.history.len(),
            ran.report.violations.len(),
            if shows { " (still shows it)" } else { "" }
        );
        if shows {
            best = next;
            best_ran = Some(ran);
            clients_failed = false;
        } else if next.clients != best.clients {
            clients_failed = true;
        } else {
            break;
        }
    }
    let Some(ran) = best_ran else {
        println!("shrink: no smaller run showed it; the shortest history is the first run's");
        return;
    };
    let lead = format!(
        " [shortest history: --seed {} --clients {} --seconds {}, {} ops, {}]",
        best.seed,
        best.clients,
        best.seconds,
        ran.history.len(),
        ran.file.display()
    );
    for v in ran
        .report
        .violations
        .iter()
        .filter(|v| checks.contains(&v.check))
    {
        print_violation(v, &ran, &lead);
    }
}
