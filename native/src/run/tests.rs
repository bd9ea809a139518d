use std::collections::{BTreeSet, VecDeque};
use std::num::NonZeroU64;

use proptest::prelude::*;

use super::*;

fn population(n: u8) -> PopulationId {
    PopulationId::try_from(format!("{n:02x}").repeat(16)).expect("a valid id")
}

fn nz(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).expect("non-zero")
}

fn start(epoch_len: u64, world_size: u64, batch_size: u64, workers: u64) -> RunState {
    let options = RunOptions {
        dataset: "toy".into(),
        seed: 7,
        epoch: 0,
        epoch_len: None,
        population: None,
        columns: vec!["label".into()],
        shuffle: ShuffleMode::Weighted,
        batch_size: nz(batch_size),
        rank: 0,
        world_size: nz(world_size),
        workers,
    };
    let mut pinned = options.request();
    pinned.population = Some(population(0));
    pinned.epoch_len = Some(nz(epoch_len));
    RunState::start(&options, &pinned).expect("a valid run")
}

/// One batch as a DataLoader hands it to a rank: its positions and population.
type Batch = (Vec<u64>, PopulationId);

/// The batches rank `rank` receives for the rest of the epoch, as a DataLoader
/// with `workers` workers delivers them: worker `k` reads its tickets' positions
/// in blocks of `batch_size`, and the loader asks the workers round-robin.
fn deliveries(state: &RunState, rank: u64, workers: u64) -> VecDeque<Batch> {
    let size = state.current().expect("a span").batch_size.get() as usize;
    let mut queues: Vec<VecDeque<Batch>> = (0..workers.max(1))
        .map(|worker| {
            let mut queue = VecDeque::new();
            for ticket in state
                .requests(rank, worker, workers.max(1), false)
                .expect("tickets")
            {
                let window = ticket.window().expect("a pinned ticket");
                let positions: Vec<u64> = window.positions(0, window.count).collect();
                assert_eq!(positions.len() % size, 0, "a ticket holds whole batches");
                let id = ticket.population.clone().expect("pinned");
                for batch in positions.chunks(size) {
                    queue.push_back((batch.to_vec(), id.clone()));
                }
            }
            queue
        })
        .collect();
    let mut delivered = VecDeque::new();
    for turn in 0.. {
        let worker = turn % queues.len();
        match queues[worker].pop_front() {
            Some(batch) => delivered.push_back(batch),
            None => break,
        }
    }
    assert!(
        queues.iter().all(VecDeque::is_empty),
        "a worker kept batches"
    );
    delivered
}

#[derive(Debug, Clone)]
struct RunSpec {
    world_size: u64,
    batch_size: u64,
    workers: u64,
    /// Steps until the checkpoint.
    steps: u64,
    /// Steps taken after it, then lost to the kill.
    lost: u64,
    /// A population switch before this step of the run, if any.
    switch_at: Option<u64>,
}

fn run_spec() -> impl Strategy<Value = RunSpec> {
    (
        1u64..=4,
        1u64..=8,
        0u64..=3,
        0u64..=25,
        0u64..=4,
        proptest::option::of(0u64..=25),
    )
        .prop_map(
            |(world_size, batch_size, workers, steps, lost, switch_at)| RunSpec {
                world_size,
                batch_size,
                workers,
                steps,
                lost,
                switch_at,
            },
        )
}

/// Run a chain of killed and resumed data-parallel runs, all ranks in lockstep;
/// returns the last checkpoint and what every rank had taken up to each
/// checkpoint of the chain (epoch, position, rank, step, population).
fn chain(epoch_len: u64, runs: &[RunSpec]) -> (RunState, Vec<Taken>) {
    let first = &runs[0];
    let mut checkpoint = start(epoch_len, first.world_size, first.batch_size, first.workers);
    let mut delivered = Vec::new();
    let mut switches = 1u8;
    for (i, spec) in runs.iter().enumerate() {
        let mut base = checkpoint.clone();
        if i > 0 {
            let generation = base.current().expect("a span").generation + 1;
            base.resume(spec.world_size, spec.batch_size, spec.workers, generation)
                .expect("a resume");
        }
        checkpoint = base.clone();
        let mut ranks: Vec<RunState> = vec![base; spec.world_size as usize];
        let plan = |ranks: &[RunState]| -> Vec<VecDeque<Batch>> {
            ranks
                .iter()
                .enumerate()
                .map(|(r, s)| deliveries(s, r as u64, spec.workers))
                .collect()
        };
        let mut queues = plan(&ranks);
        for step in 0..spec.steps + spec.lost {
            if spec.switch_at == Some(step) {
                let at = ranks[0].consumed();
                for state in &mut ranks {
                    state.switch(at, population(switches)).expect("a boundary");
                }
                switches += 1;
                queues = plan(&ranks);
            }
            if queues[0].is_empty() {
                for state in &mut ranks {
                    assert_eq!(state.batches_left().expect("count"), 0);
                    state.finish_epoch();
                    let next = state.epoch() + 1;
                    state.set_epoch(next).expect("the next epoch");
                }
                queues = plan(&ranks);
            }
            for (rank, state) in ranks.iter_mut().enumerate() {
                let (positions, id) = queues[rank].pop_front().expect("a batch for every rank");
                state.advance(positions[0]).expect("an advance");
                if step < spec.steps {
                    let epoch = positions[0] / epoch_len;
                    for &position in &positions {
                        delivered.push(Taken {
                            epoch,
                            position,
                            rank: rank as u64,
                            step: state.steps() - 1,
                            population: id.clone(),
                        });
                    }
                }
            }
            assert!(
                ranks.windows(2).all(|w| w[0] == w[1]),
                "ranks in lockstep agree"
            );
            if step + 1 == spec.steps {
                // Saved and loaded as a checkpoint is.
                let saved = ranks[0].to_json().expect("saved");
                checkpoint = RunState::from_json(&saved).expect("loaded");
                assert_eq!(checkpoint, ranks[0]);
            }
        }
    }
    (checkpoint, delivered)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// For any chain of kills and resumes (world sizes, batch sizes, workers,
    /// switches, epoch ends), what the ranks took up to each checkpoint is
    /// disjoint and equal, rank and step and population, to what the last
    /// state says the run consumed.
    #[test]
    fn a_chain_of_resumes_consumed_exactly_what_its_state_says(
        epoch_len in 32u64..=160,
        runs in proptest::collection::vec(run_spec(), 1..=5),
    ) {
        let (state, mut delivered) = chain(epoch_len, &runs);
        let positions: BTreeSet<u64> = delivered.iter().map(|t| t.position).collect();
        prop_assert_eq!(positions.len(), delivered.len(), "a position was taken twice");
        let mut said = state.taken(&state.seen(None).expect("the history"));
        delivered.sort();
        said.sort();
        prop_assert_eq!(said, delivered);
        let resumes = state.resumes();
        prop_assert_eq!(resumes.len(), runs.len());
        prop_assert!(resumes.windows(2).all(|w| w[0].generation < w[1].generation));
    }
}

#[test]
fn a_state_round_trips_and_names_a_bad_key() {
    let mut state = start(100, 2, 8, 1);
    state.advance(0).expect("advance");
    let saved: Value = serde_json::from_slice(&state.to_json().expect("json")).expect("parse");
    assert_eq!(saved["version"], 2);
    assert_eq!(saved["position"], 16);
    assert_eq!(RunState::from_value(saved.clone()).expect("load"), state);
    let refuse = |key: &str, value: Value| {
        let mut bad = saved.clone();
        bad[key] = value;
        RunState::from_value(bad).expect_err("refused").to_string()
    };
    assert!(refuse("seed", Value::from("1")).contains("'seed'"));
    assert!(refuse("position", Value::from(101)).contains("'position'"));
    assert!(refuse("steps", Value::from(3)).contains("'steps'"));
    assert!(refuse("dataset", Value::from("../x")).contains("dataset name"));
    assert!(refuse("version", Value::from(7)).contains("'version'"));
    assert!(refuse("extra", Value::from(1)).contains("'extra'"));
    assert!(refuse("segments", serde_json::json!([])).contains("'segments'"));
    assert!(refuse("segments", serde_json::json!([[5, "0".repeat(32)]])).contains("'segments'"));
    assert!(refuse("segments", serde_json::json!([[0, "xyz"]])).contains("xyz"));
    assert!(refuse("run", Value::from("abc")).contains("run id"));
    assert!(refuse("world_size", Value::from(3)).contains("'resumes'"));
    assert!(refuse("resumes", serde_json::json!([])).contains("'resumes'"));
    let mut spans = saved.clone();
    spans["resumes"][0]["until"] = serde_json::json!([0, 16]);
    assert!(RunState::from_value(spans)
        .expect_err("refused")
        .to_string()
        .contains("'until'"));
}

#[test]
fn a_version_1_state_loads_as_the_run_it_described() {
    let old = serde_json::json!({
        "version": 1, "dataset": "toy", "seed": 7, "shuffle": true, "columns": [],
        "epoch_len": 100, "batch_size": 8, "world_size": 2, "epoch": 1, "position": 32,
        "steps": 2, "segments": [[0, "0".repeat(32)]]
    });
    let state = RunState::from_value(old.clone()).expect("a version 1 state");
    assert_eq!(
        state,
        RunState::from_value(old).expect("again"),
        "the same run id"
    );
    let seen = state.seen(None).expect("history");
    // All of epoch 0 (6 steps of 16, the tail of 4 dropped), then epoch 1 up to 32.
    let rows: u64 = seen.iter().map(Span::rows).sum();
    assert_eq!(rows, 96 + 32);
    let again = RunState::from_json(&state.to_json().expect("json")).expect("reloaded");
    assert_eq!(again, state);
}

#[test]
fn set_epoch_continues_a_finished_epoch_and_records_a_left_one() {
    let mut state = start(100, 1, 10, 0);
    state.advance(0).expect("advance");
    state.set_epoch(2).expect("a jump");
    assert_eq!(state.resumes().len(), 2);
    assert_eq!(state.resumes()[0].until, Some((0, 10)));
    let batches = state.batches_left().expect("count");
    for b in 0..batches {
        state.advance(200 + b * 10).expect("advance");
    }
    state.finish_epoch();
    state.set_epoch(3).expect("the next epoch");
    assert_eq!(
        state.resumes().len(),
        2,
        "a finished epoch continues the span"
    );
    let epochs: BTreeSet<u64> = state
        .seen(None)
        .expect("history")
        .iter()
        .map(|s| s.epoch)
        .collect();
    assert_eq!(epochs, BTreeSet::from([0, 2]));
}

#[test]
fn a_switch_must_be_on_the_grid_and_not_behind() {
    let mut state = start(100, 2, 8, 0);
    state.advance(0).expect("advance");
    assert!(state.switch(0, population(1)).is_err());
    assert!(state.switch(20, population(1)).is_err());
    state.switch(32, population(1)).expect("a boundary");
    state.switch(48, population(2)).expect("a later boundary");
    state
        .switch(32, population(3))
        .expect("replaces the later one");
    assert_eq!(state.segments().len(), 2);
    assert_eq!(state.population_at(99), &population(3));
}

#[test]
fn a_resume_needs_a_newer_generation_and_a_share_for_every_rank() {
    let mut state = start(100, 2, 8, 0);
    assert!(state.resume(2, 8, 0, 0).is_err());
    let message = state.resume(20, 8, 0, 1).expect_err("too wide").to_string();
    assert!(message.contains("0 batches"), "{message}");
    state.resume(3, 4, 2, 1).expect("a resume");
    assert_eq!(state.current().expect("span").workers, 2);
}

#[test]
fn fencing_gives_one_generation_per_checkpoint_and_fences_older_ones() {
    use crate::population::PopulationStore;
    use fence::Claim;

    let dir = tempfile::tempdir().expect("a temp dir");
    let store = PopulationStore::open(dir.path()).expect("a store");
    let run = RunId::new();
    let from = |after, position, fresh| Claim {
        after,
        place: (0, position),
        fresh,
    };
    store
        .runs()
        .check(&run, 0)
        .expect("a run never resumed is not fenced");
    // Every rank loading one checkpoint gets one generation.
    assert_eq!(store.claim_run(&run, from(0, 16, false)).expect("claim"), 1);
    assert_eq!(store.claim_run(&run, from(0, 16, false)).expect("claim"), 1);
    let message = store.runs().check(&run, 0).expect_err("fenced").to_string();
    assert!(message.contains("resumed elsewhere"), "{message}");
    assert!(matches!(store.runs().check(&run, 0), Err(Error::Fenced(_))));
    store
        .runs()
        .check(&run, 1)
        .expect("the newest is not fenced");
    // A fresh claim (rank 0 of a distributed job) and a roll-back are newer still.
    assert_eq!(store.claim_run(&run, from(0, 16, true)).expect("claim"), 2);
    assert_eq!(store.claim_run(&run, from(1, 48, false)).expect("claim"), 3);
    assert!(store.runs().check(&run, 2).is_err());
    // Another run is its own.
    store.runs().check(&RunId::new(), 0).expect("another run");
}

#[test]
fn a_run_starts_only_from_a_pinned_request() {
    let options = RunOptions::from_value(serde_json::json!({
        "dataset": "toy", "seed": 7, "batch_size": 4, "world_size": 2, "rank": 1, "workers": 3
    }))
    .expect("valid options");
    let unpinned = options.request();
    let error = RunState::start(&options, &unpinned).expect_err("not pinned");
    assert!(error.to_string().contains("did not pin"), "{error}");
    let mut pinned = unpinned;
    pinned.population = Some(population(1));
    pinned.epoch_len = Some(nz(100));
    let state = RunState::start(&options, &pinned).expect("a run");
    let span = state.current().expect("a span");
    assert_eq!(
        (span.world_size.get(), span.batch_size.get(), span.workers),
        (2, 4, 3)
    );
    assert_eq!(state.segments, vec![Segment(0, population(1))]);
    assert_eq!(
        (state.epoch, state.position, state.epoch_len.get()),
        (0, 0, 100)
    );
}
