//! The in-process dataset's stream cursor: which positions the next iterator
//! takes. Each new iterator takes the next `epoch_len` positions; an update
//! resets the position to 0 and the epoch length to the new row count.

use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::population::{library_scratch_dir, write_population, Population};
use crate::sampling::{StreamOrder, StreamWindow};
use crate::storage::CacheSet;

struct Cursor {
    population: Arc<Population>,
    position: u64,
    epoch_len: u64,
}

/// The epoch an iterator reads: a population snapshot and a window.
pub struct EpochSnapshot {
    pub population: Arc<Population>,
    pub window: StreamWindow,
}

pub struct Dataset {
    caches: Arc<CacheSet>,
    order: StreamOrder,
    cursor: Mutex<Cursor>,
}

impl Dataset {
    pub fn new(caches: Arc<CacheSet>, order: StreamOrder) -> Result<Self> {
        let written = Population::write_full(&caches, &library_scratch_dir()?)?;
        let population = Arc::new(written.open_unnamed(&caches)?);
        let epoch_len = population.num_rows() as u64;
        Ok(Dataset {
            caches,
            order,
            cursor: Mutex::new(Cursor {
                population,
                position: 0,
                epoch_len,
            }),
        })
    }

    fn cursor(&self) -> Result<MutexGuard<'_, Cursor>> {
        self.cursor
            .lock()
            .map_err(|_| Error::internal("the dataset's lock is poisoned"))
    }

    pub fn caches(&self) -> &Arc<CacheSet> {
        &self.caches
    }

    pub fn order(&self) -> StreamOrder {
        self.order
    }

    pub fn population(&self) -> Result<Arc<Population>> {
        Ok(self.cursor()?.population.clone())
    }

    pub fn epoch_len(&self) -> Result<u64> {
        Ok(self.cursor()?.epoch_len)
    }

    /// Swap in a validated population (built without holding the lock).
    pub fn activate(&self, population: Population) -> Result<()> {
        let mut cursor = self.cursor()?;
        cursor.epoch_len = population.num_rows() as u64;
        cursor.population = Arc::new(population);
        cursor.position = 0;
        Ok(())
    }

    /// Validate `batches` as a population (streamed into scratch files that
    /// are mapped, see `library_scratch_dir`) and activate it.
    pub fn update(&self, batches: impl IntoIterator<Item = Result<RecordBatch>>) -> Result<()> {
        let written = write_population(self.caches.clone(), &library_scratch_dir()?, batches)?;
        self.activate(written.open_unnamed(&self.caches)?)
    }

    pub fn set_epoch_len(&self, epoch_len: NonZeroU64) -> Result<()> {
        self.cursor()?.epoch_len = epoch_len.get();
        Ok(())
    }

    /// Take the next epoch (the current population and the next `epoch_len`
    /// positions) and open it with `open`. The position moves only when `open`
    /// succeeds, so a rejected request costs nothing.
    pub fn next_epoch_with<T>(&self, open: impl FnOnce(EpochSnapshot) -> Result<T>) -> Result<T> {
        let mut cursor = self.cursor()?;
        let window = StreamWindow::new(cursor.position, cursor.epoch_len, 1)?;
        let opened = open(EpochSnapshot {
            population: cursor.population.clone(),
            window,
        })?;
        cursor.position = cursor.position.saturating_add(cursor.epoch_len);
        Ok(opened)
    }
}
