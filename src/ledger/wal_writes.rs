//! The writer's WAL writes, coalesced: a VFS over SQLite's `unix` that gathers the frames
//! of a commit and writes them with one `pwrite`, where SQLite writes each frame with two
//! (its 24-byte header, then its page).
//!
//! Why: a commit of the ledger writes every page it dirtied as a frame, about eight a
//! commit and three commits a message, and a frame of 4,120 bytes straddles two pages of
//! the file, so the kernel's buffered write path (which costs per page of the file it
//! touches, not per byte) ran three times a frame: `pwrite` was a third of the CPU the
//! ledger spends on a message. With the frames gathered, the ledger's work on a message
//! takes about 30% less CPU (155 → 107 µs on the machine of the README's figures;
//! `cargo bench --bench hot_path`, "the ledger's work on a message alone").
//!
//! Why it is safe, against a crash and against another connection:
//! - A commit is whole on the file before SQLite tells anyone it happened. SQLite writes a
//!   commit's frames in order, the commit frame last (its header names the database's
//!   size, which no other frame's does); the write that completes the commit frame writes
//!   everything gathered before it returns; a commit frame's header that SQLite writes
//!   again after that (it recomputes the checksums of a transaction that wrote a page
//!   twice) is written at once. Only then does SQLite publish the new frames
//!   in the wal-index, which other connections (this process's readers and checkpointer,
//!   another process) read the WAL by. A crash before that leaves at most the frames of an
//!   uncommitted transaction unwritten, which a crash may always leave.
//! - A failed write fails the commit: the write that completes it returns the error of
//!   writing what was gathered (a full disk is `SQLITE_FULL`, as before), so SQLite rolls
//!   the transaction back and does not publish its frames.
//! - Nothing reads around what is gathered: every other operation on the WAL (a read, a
//!   sync, a truncation, its size, a file control, closing it) and any write that does not
//!   continue what is gathered first writes it out, in order.
//! - Nothing of a transaction that did not commit is written once another connection may
//!   write: when a write transaction ends, as the connection lets go of the WAL's write
//!   lock, anything still gathered (frames a large transaction spilled before it rolled
//!   back) is written out first, past the last commit, where it is nothing to SQLite.
//! - Only the WAL is gathered, and only on the writer's connection. The database file, the
//!   wal-index and every lock are the `unix` VFS's own, so this connection and every
//!   other (sqlx's, the readers', another process's) lock and see the same files.

use std::ffi::{CStr, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name the writer opens its connection with.
pub(super) const VFS_NAME: &CStr = c"switchboard-coalesced-wal";

/// The VFS this one writes through.
const UNDERLYING_VFS: &CStr = c"unix";

/// At most this much of a WAL is gathered before it is written: a message's commit (about
/// eight frames of 4 KiB) fits whole; intake's commit of a full batch of 100 updates is
/// written in a few writes. The buffer is allocated when a WAL is first written and kept
/// while it is open.
const GATHER_BYTES: usize = 64 * 1024;

/// The wal-index lock a connection holds while it writes to the WAL (`WAL_WRITE_LOCK` in
/// SQLite's source).
const WAL_WRITE_LOCK: c_int = 0;

/// The size of a WAL frame's header, which SQLite writes on its own before the frame's page.
const FRAME_HEADER_BYTES: c_int = 24;

/// Registers the VFS with SQLite, once per process. Its error is SQLite's result code.
pub(super) fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<Result<(), c_int>> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: `sqlite3_vfs_find` initialises SQLite if needed and returns a VFS that
        // lives as long as the process (`unix` is never unregistered).
        let underlying = unsafe { ffi::sqlite3_vfs_find(UNDERLYING_VFS.as_ptr()) };
        if underlying.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        // SAFETY: `underlying` points to a valid VFS (above).
        let mut vfs = unsafe { *underlying };
        let Ok(shim_size) = c_int::try_from(UNDERLYING_OFFSET) else { return Err(ffi::SQLITE_ERROR) };
        vfs.szOsFile += shim_size;
        vfs.pNext = ptr::null_mut();
        vfs.zName = VFS_NAME.as_ptr();
        vfs.pAppData = underlying.cast();
        vfs.xOpen = Some(open);
        // Every other method is `unix`'s own: none of them reads `pAppData`, which only
        // `unix`'s `xOpen` does, and that is called with `unix` itself.
        let vfs = Box::leak(Box::new(vfs));
        // SAFETY: `vfs` is valid and lives as long as the process.
        match unsafe { ffi::sqlite3_vfs_register(vfs, 0) } {
            ffi::SQLITE_OK => Ok(()),
            code => Err(code),
        }
    })
}

/// An open file: SQLite's handle, with what this VFS keeps beside it; the `unix` VFS's own
/// handle follows, at [`UNDERLYING_OFFSET`], in the same allocation.
#[repr(C)]
struct ShimFile {
    base: ffi::sqlite3_file,
    /// The WAL's gathered writes; null for any other file.
    gathered: *mut Gathered,
    /// A WAL's database and a database's WAL, while both are open; else null.
    linked: *mut ShimFile,
}

/// Where the `unix` handle starts in a [`ShimFile`]'s allocation, aligned as SQLite aligns
/// an allocation (8 bytes).
const UNDERLYING_OFFSET: usize = std::mem::size_of::<ShimFile>().next_multiple_of(8);

/// The writes gathered from a WAL and not written yet: contiguous bytes from `offset`.
#[derive(Default)]
struct Gathered {
    bytes: Vec<u8>,
    offset: i64,
    /// Where the page of the commit frame whose header was the last write goes: the write
    /// there completes the commit.
    commit_page_offset: Option<i64>,
}

/// The `unix` handle of `file`.
///
/// # Safety
/// `file` is a handle this VFS opened (see [`open`]).
unsafe fn underlying(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: SQLite allocated `szOsFile` bytes for the handle, which include the `unix`
    // handle at this offset.
    unsafe { file.cast::<u8>().add(UNDERLYING_OFFSET).cast() }
}

/// The `unix` methods of `file`'s `unix` handle.
///
/// # Safety
/// `file` is a handle this VFS opened successfully.
unsafe fn methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: `open` installs this VFS's methods only over a `unix` handle with methods of
    // version 3, which live as long as the process.
    unsafe { &*(*underlying(file)).pMethods }
}

/// What `file` has gathered from its WAL; `None` for any other file.
///
/// # Safety
/// `file` is a handle this VFS opened successfully, and no other reference to what it
/// has gathered is live.
unsafe fn gathered<'a>(file: *mut ffi::sqlite3_file) -> Option<&'a mut Gathered> {
    // SAFETY: a handle this VFS opened is a `ShimFile`; `gathered` is null or owned by it.
    unsafe { (*file.cast::<ShimFile>()).gathered.as_mut() }
}

/// Writes out what was gathered from `file`, if anything.
///
/// # Safety
/// `file` is a handle this VFS opened successfully, and `gathered` is its own.
unsafe fn write_out(file: *mut ffi::sqlite3_file, gathered: &mut Gathered) -> c_int {
    if gathered.bytes.is_empty() {
        return ffi::SQLITE_OK;
    }
    let Ok(length) = c_int::try_from(gathered.bytes.len()) else { return ffi::SQLITE_IOERR_WRITE };
    // SAFETY: the bytes are valid for `length`; the handle is `unix`'s.
    let result = unsafe {
        (methods(file).xWrite.expect("present"))(
            underlying(file),
            gathered.bytes.as_ptr().cast(),
            length,
            gathered.offset,
        )
    };
    #[cfg(test)]
    tests::WRITES_OUT.with(|count| count.set(count.get() + 1));
    // Written or failed, they are not written again: a failure fails the transaction that
    // wrote them, which SQLite then rolls back without publishing any of its frames.
    gathered.bytes.clear();
    result
}

/// Writes out what was gathered from `file` before another operation on it.
///
/// # Safety
/// `file` is a handle this VFS opened successfully.
unsafe fn write_out_any(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as the caller's.
    unsafe {
        match gathered(file) {
            Some(gathered) => write_out(file, gathered),
            None => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: `pAppData` is the `unix` VFS (see `register`); SQLite passes a handle of
    // `szOsFile` bytes, the `unix` handle's among them.
    unsafe {
        let unix: *mut ffi::sqlite3_vfs = (*vfs).pAppData.cast();
        let inner = underlying(file);
        let shim = file.cast::<ShimFile>();
        (*shim).base.pMethods = ptr::null();
        (*shim).gathered = ptr::null_mut();
        (*shim).linked = ptr::null_mut();
        let result = ((*unix).xOpen.expect("unix opens files"))(unix, name, inner, flags, out_flags);
        let inner_methods = (*inner).pMethods;
        if inner_methods.is_null() {
            return result;
        }
        // Methods of an older version stop before the fields this VFS forwards.
        if (*inner_methods).iVersion < 3 {
            if let Some(close) = (*inner_methods).xClose {
                close(inner);
            }
            return ffi::SQLITE_CANTOPEN;
        }
        // From here SQLite closes the handle through these methods, even if the open failed.
        (*shim).base.pMethods = &IO_METHODS;
        if result == ffi::SQLITE_OK && flags & ffi::SQLITE_OPEN_WAL != 0 {
            (*shim).gathered = Box::into_raw(Box::default());
            // SQLite names a WAL so that this finds its database's handle.
            let database = ffi::sqlite3_database_file_object(name);
            if !database.is_null() && ptr::eq((*database).pMethods, &IO_METHODS) {
                let database = database.cast::<ShimFile>();
                (*database).linked = shim;
                (*shim).linked = database;
            }
        }
        result
    }
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

// Every method below is called by SQLite with a handle `open` gave these methods to, so
// `underlying`, `methods`, `gathered` and `write_out_any` may be called with it; each method of a
// `unix` handle of version 3 is present.

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let written = write_out_any(file);
        let shim = file.cast::<ShimFile>();
        if !(*shim).gathered.is_null() {
            drop(Box::from_raw((*shim).gathered));
            (*shim).gathered = ptr::null_mut();
        }
        if !(*shim).linked.is_null() {
            (*(*shim).linked).linked = ptr::null_mut();
            (*shim).linked = ptr::null_mut();
        }
        let closed = (methods(file).xClose.expect("present"))(underlying(file));
        if written == ffi::SQLITE_OK { closed } else { written }
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let Some(gathered) = gathered(file) else {
            return (methods(file).xWrite.expect("present"))(underlying(file), data, amount, offset);
        };
        let Ok(length) = usize::try_from(amount) else { return ffi::SQLITE_IOERR_WRITE };
        let bytes: &[u8] = if length == 0 { &[] } else { std::slice::from_raw_parts(data.cast(), length) };
        // Taken before anything is written out: this write completes a commit however
        // much was gathered before it.
        let completes_commit = gathered.commit_page_offset.take() == Some(offset);
        // A frame's header holds, at bytes 4..8, the database's size in pages after a
        // commit, and zero in every frame but a commit's last.
        let commit_header = amount == FRAME_HEADER_BYTES && bytes[4..8] != [0, 0, 0, 0];
        let continues = !gathered.bytes.is_empty() && gathered.offset + gathered.bytes.len() as i64 == offset;
        if !gathered.bytes.is_empty() && (!continues || gathered.bytes.len() + length > GATHER_BYTES) {
            let result = write_out(file, gathered);
            if result != ffi::SQLITE_OK {
                return result;
            }
        }
        // Written at once: what is too large to gather, and a commit frame's header that
        // does not continue what is gathered. That is either a commit of a single frame,
        // whose page follows, or a header SQLite writes again after the commit frame: a
        // transaction that wrote a page twice has its frames' checksums recomputed at its
        // commit, each frame read back and its header rewritten. Gathered, the last of
        // those would reach the file only as the write lock goes, after SQLite published
        // the commit; a crash in between would leave the checksums broken before the
        // commit frame, and recovery would drop the commit.
        if length > GATHER_BYTES || (commit_header && !continues) {
            let result = (methods(file).xWrite.expect("present"))(underlying(file), data, amount, offset);
            if commit_header && result == ffi::SQLITE_OK {
                gathered.commit_page_offset = Some(offset + i64::from(FRAME_HEADER_BYTES));
            }
            return result;
        }
        if gathered.bytes.is_empty() {
            gathered.offset = offset;
            gathered.bytes.reserve_exact(GATHER_BYTES);
        }
        gathered.bytes.extend_from_slice(bytes);
        if completes_commit {
            return write_out(file, gathered);
        }
        if commit_header {
            gathered.commit_page_offset = Some(offset + i64::from(FRAME_HEADER_BYTES));
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    buffer: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let written = write_out_any(file);
        if written != ffi::SQLITE_OK {
            return written;
        }
        (methods(file).xRead.expect("present"))(underlying(file), buffer, amount, offset)
    }
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    unsafe {
        let written = write_out_any(file);
        if written != ffi::SQLITE_OK {
            return written;
        }
        (methods(file).xTruncate.expect("present"))(underlying(file), size)
    }
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    unsafe {
        let written = write_out_any(file);
        if written != ffi::SQLITE_OK {
            return written;
        }
        (methods(file).xSync.expect("present"))(underlying(file), flags)
    }
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut ffi::sqlite3_int64) -> c_int {
    unsafe {
        let written = write_out_any(file);
        if written != ffi::SQLITE_OK {
            return written;
        }
        (methods(file).xFileSize.expect("present"))(underlying(file), size)
    }
}

unsafe extern "C" fn file_control(file: *mut ffi::sqlite3_file, op: c_int, argument: *mut c_void) -> c_int {
    unsafe {
        // A size hint, for one, may write to the file.
        let written = write_out_any(file);
        if written != ffi::SQLITE_OK {
            return written;
        }
        (methods(file).xFileControl.expect("present"))(underlying(file), op, argument)
    }
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe { (methods(file).xLock.expect("present"))(underlying(file), level) }
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    unsafe { (methods(file).xUnlock.expect("present"))(underlying(file), level) }
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, reserved: *mut c_int) -> c_int {
    unsafe { (methods(file).xCheckReservedLock.expect("present"))(underlying(file), reserved) }
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe { (methods(file).xSectorSize.expect("present"))(underlying(file)) }
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe { (methods(file).xDeviceCharacteristics.expect("present"))(underlying(file)) }
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    region_size: c_int,
    extend: c_int,
    mapped: *mut *mut c_void,
) -> c_int {
    unsafe {
        (methods(file).xShmMap.expect("present"))(underlying(file), region, region_size, extend, mapped)
    }
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    count: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        // A write transaction ends, committed or rolled back: nothing of it may be written
        // once another connection can write. A commit wrote out all it gathered at its
        // commit frame, so what is left here are frames never committed (spilled by a
        // transaction that then rolled back; SQLite reads pages back as it rolls back, so
        // in practice nothing is left). Written out, not dropped: while the lock is held
        // they land past the WAL's last commit, where the next writer writes over them.
        let wal = (*file.cast::<ShimFile>()).linked;
        let ends_a_write =
            offset == WAL_WRITE_LOCK && flags == ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE;
        if ends_a_write && !wal.is_null() {
            // Failing to write frames nothing will read fails nothing: the unlock goes on.
            let _ = write_out_any(wal.cast());
        }
        (methods(file).xShmLock.expect("present"))(underlying(file), offset, count, flags)
    }
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    unsafe { (methods(file).xShmBarrier.expect("present"))(underlying(file)) }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    unsafe { (methods(file).xShmUnmap.expect("present"))(underlying(file), delete) }
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    mapped: *mut *mut c_void,
) -> c_int {
    unsafe { (methods(file).xFetch.expect("present"))(underlying(file), offset, amount, mapped) }
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    mapped: *mut c_void,
) -> c_int {
    unsafe { (methods(file).xUnfetch.expect("present"))(underlying(file), offset, mapped) }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use rusqlite::{Connection, OpenFlags};

    use super::*;

    thread_local! {
        /// How many times this thread's connections wrote out what they gathered.
        pub(super) static WRITES_OUT: Cell<usize> = const { Cell::new(0) };
    }

    fn writes_out() -> usize {
        WRITES_OUT.with(Cell::get)
    }

    /// A connection through this VFS to a WAL database at `path`, with a table of rows
    /// spread over several indexes, as the ledger's are, and the writer's `synchronous`;
    /// no automatic checkpoint, so the commits stay in the WAL for another connection to
    /// read from there.
    fn writer(path: &Path) -> Connection {
        register().unwrap();
        let db = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), VFS_NAME).unwrap();
        db.pragma_update(None, "journal_mode", "WAL").unwrap();
        db.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        db.pragma_update(None, "synchronous", "NORMAL").unwrap();
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, name TEXT, body BLOB);
             CREATE INDEX IF NOT EXISTS rows_by_name ON rows (name);
             CREATE INDEX IF NOT EXISTS rows_by_body ON rows (substr(body, 1, 16));",
        )
        .unwrap();
        db
    }

    /// A new database in a directory of its own, and [`writer`]'s connection to it.
    fn fresh(name: &str) -> (tempfile::TempDir, PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        let db = writer(&path);
        (dir, path, db)
    }

    /// A page cache of a few pages, which spills a transaction of more to the WAL before
    /// it ends.
    fn spill_early(db: &Connection) {
        db.pragma_update(None, "cache_size", 4).unwrap();
        db.pragma_update(None, "cache_spill", 4).unwrap();
    }

    /// A connection through SQLite's own `unix` VFS, as sqlx's, the readers' and another
    /// process's are.
    fn other(path: &Path) -> Connection {
        Connection::open(path).unwrap()
    }

    fn insert(db: &Connection, id: i64, body_bytes: usize) {
        let body: Vec<u8> = (0..body_bytes).map(|i| (i as i64 * 31 + id) as u8).collect();
        db.execute(
            "INSERT INTO rows (id, name, body) VALUES (?1, ?2, ?3)",
            rusqlite::params![id, format!("row {id}"), body],
        )
        .unwrap();
    }

    /// The ids and bodies another connection reads, and whether it finds the file whole.
    fn read_back(path: &Path) -> (Vec<(i64, usize)>, String) {
        let db = other(path);
        let rows = db
            .prepare("SELECT id, length(body) FROM rows ORDER BY id")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as usize)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let integrity = db.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
        (rows, integrity)
    }

    #[test]
    fn a_commit_reaches_the_wal_in_one_write_before_it_returns() {
        let (_dir, path, db) = fresh("one.db");
        insert(&db, 1, 100);

        // A row of 10 KB and its indexes: several pages, each a frame of two writes.
        let before = writes_out();
        insert(&db, 2, 10_000);
        assert_eq!(writes_out() - before, 1, "one write for the whole commit");

        // Another connection reads it from the WAL while this one is still open: had the
        // commit stayed gathered, the frames the wal-index names would not be on the file.
        assert_eq!(read_back(&path), (vec![(1, 100), (2, 10_000)], "ok".into()));
    }

    #[test]
    fn a_commit_larger_than_what_is_gathered_is_written_in_parts_and_whole() {
        let (_dir, path, db) = fresh("large.db");
        let before = writes_out();
        insert(&db, 1, 5 * GATHER_BYTES);
        let writes = writes_out() - before;
        assert!(writes > 5 && writes < 10, "{writes} writes for about six times what is gathered at most");
        insert(&db, 2, 100);
        assert_eq!(read_back(&path), (vec![(1, 5 * GATHER_BYTES), (2, 100)], "ok".into()));
    }

    #[test]
    fn a_transaction_rolled_back_after_it_spilled_to_the_wal_leaves_nothing() {
        let (_dir, path, db) = fresh("spilled.db");
        insert(&db, 1, 100);
        spill_early(&db);
        db.execute_batch("BEGIN").unwrap();
        for id in 2..40 {
            insert(&db, id, 3_000);
        }
        db.execute_batch("ROLLBACK").unwrap();
        insert(&db, 40, 100);
        assert_eq!(read_back(&path), (vec![(1, 100), (40, 100)], "ok".into()));
    }

    #[test]
    fn a_wal_started_again_after_a_checkpoint_is_written_from_its_header() {
        let (dir, path, db) = fresh("restarted.db");
        insert(&db, 1, 5_000);
        // Another connection copies the WAL into the database and empties it; the next
        // commit writes a new WAL header at its start, then its frames.
        let _: (i64, i64, i64) = other(&path)
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap();
        assert_eq!(std::fs::metadata(dir.path().join("restarted.db-wal")).unwrap().len(), 0);
        let before = writes_out();
        insert(&db, 2, 5_000);
        // SQLite syncs a new WAL header before it writes frames after it, whatever the
        // `synchronous` setting: the header is written out for that sync, then the frames.
        assert_eq!(writes_out() - before, 2, "the header, then the frames in one write");
        assert_eq!(read_back(&path), (vec![(1, 5_000), (2, 5_000)], "ok".into()));
    }

    #[test]
    fn what_a_rolled_back_transaction_gathered_never_overwrites_a_later_commit_of_another_connection() {
        let (_dir, path, db) = fresh("shared.db");
        for id in 1..=8 {
            insert(&db, id, 3_000);
        }
        // This connection spills frames to the WAL (gathered, not all written) and rolls
        // back: its frames were never committed.
        spill_early(&db);
        db.execute_batch(
            "BEGIN; INSERT INTO rows (id, name, body) VALUES (9, 'row 9', zeroblob(150000)); ROLLBACK;",
        )
        .unwrap();
        // Another connection (another process, say) commits frames where they were to go.
        let theirs = other(&path);
        theirs.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        theirs.execute("UPDATE rows SET name = 'theirs'", []).unwrap();
        // This connection's next read and write must not write what it gathered over them.
        let names: i64 =
            db.query_row("SELECT count(*) FROM rows WHERE name = 'theirs'", [], |row| row.get(0)).unwrap();
        insert(&db, 20, 100);
        let (rows, integrity) = read_back(&path);
        assert_eq!(integrity, "ok");
        assert_eq!(rows.len(), 9);
        assert_eq!(names, 8, "this connection reads the other's commit");
        let names: i64 = other(&path)
            .query_row("SELECT count(*) FROM rows WHERE name = 'theirs'", [], |row| row.get(0))
            .unwrap();
        assert_eq!(names, 8, "the other connection's commit stands");
    }

    /// The handles of `db`'s database and WAL, as this VFS opened them.
    fn handles(db: &Connection) -> (*mut ShimFile, *mut ShimFile) {
        let mut pointers = [ptr::null_mut::<ffi::sqlite3_file>(); 2];
        for (op, pointer) in
            [ffi::SQLITE_FCNTL_FILE_POINTER, ffi::SQLITE_FCNTL_JOURNAL_POINTER].into_iter().zip(&mut pointers)
        {
            // SAFETY: both file controls write a file's handle to the pointer they are given.
            let result = unsafe {
                ffi::sqlite3_file_control(db.handle(), c"main".as_ptr(), op, ptr::from_mut(pointer).cast())
            };
            assert_eq!(result, ffi::SQLITE_OK);
            assert!(ptr::eq(unsafe { (**pointer).pMethods }, &IO_METHODS), "a handle of this VFS");
        }
        (pointers[0].cast(), pointers[1].cast())
    }

    #[test]
    fn what_is_left_gathered_when_a_write_transaction_ends_is_written_out_before_its_lock_goes() {
        let (dir, path, db) = fresh("linked.db");
        insert(&db, 1, 100);
        let (database, wal) = handles(&db);
        // SAFETY: the handles are open while `db` is, and only this thread uses them.
        let gathered = unsafe {
            assert!(ptr::eq((*database).linked, wal) && ptr::eq((*wal).linked, database), "linked both ways");
            &mut *(*wal).gathered
        };
        assert!(gathered.bytes.is_empty(), "a commit leaves nothing gathered");

        // As a transaction that spilled and rolled back might leave it: frames past the
        // WAL's end, gathered while the write lock is held.
        let wal_file = dir.path().join("linked.db-wal");
        let wal_size = std::fs::metadata(&wal_file).unwrap().len();
        db.execute_batch("BEGIN IMMEDIATE").unwrap();
        gathered.offset = i64::try_from(wal_size).unwrap() + 4_120;
        gathered.bytes.extend_from_slice(&[7; 4_120]);
        assert_eq!(std::fs::metadata(&wal_file).unwrap().len(), wal_size);
        db.execute_batch("ROLLBACK").unwrap();
        assert!(gathered.bytes.is_empty(), "written out as the write lock went");
        assert_eq!(std::fs::metadata(&wal_file).unwrap().len(), wal_size + 2 * 4_120);
        // Past the last commit, they are nothing to SQLite.
        insert(&db, 2, 100);
        assert_eq!(read_back(&path), (vec![(1, 100), (2, 100)], "ok".into()));
    }

    /// A copy of the database and its WAL as a crash would leave them now (no wal-index),
    /// opened and so recovered from the WAL by another connection.
    fn recovered_copy(dir: &Path, name: &str) -> (Vec<(i64, usize)>, String) {
        let copy = dir.join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(dir.join(name), copy.join(name)).unwrap();
        std::fs::copy(dir.join(format!("{name}-wal")), copy.join(format!("{name}-wal"))).unwrap();
        read_back(&copy.join(name))
    }

    #[test]
    fn a_transaction_that_wrote_a_page_twice_commits_whole_and_survives_recovery() {
        let (dir, path, db) = fresh("twice.db");
        insert(&db, 1, 100);
        // The transaction spills its pages to the WAL, the update writes spilled pages
        // again, in place, and the commit recomputes the frames' checksums.
        spill_early(&db);
        db.execute_batch("BEGIN").unwrap();
        for id in 2..30 {
            insert(&db, id, 2_000);
        }
        db.execute("UPDATE rows SET name = 'again'", []).unwrap();
        db.execute_batch("COMMIT").unwrap();
        let expected: Vec<(i64, usize)> =
            std::iter::once((1, 100)).chain((2..30).map(|id| (id, 2_000))).collect();
        assert_eq!(read_back(&path), (expected.clone(), "ok".into()));
        assert_eq!(recovered_copy(dir.path(), "twice.db"), (expected, "ok".into()));
    }

    #[test]
    fn a_commit_frame_header_written_again_reaches_the_file_at_once() {
        let (dir, path, db) = fresh("rewritten.db");
        insert(&db, 1, 100);
        let (_, wal) = handles(&db);
        // SAFETY: the WAL's handle is open while `db` is, and only this thread uses it.
        unsafe {
            let methods = &*(*wal).base.pMethods;
            let wal_size = std::fs::metadata(dir.path().join("rewritten.db-wal")).unwrap().len();
            let last_frame = i64::try_from(wal_size).unwrap() - 4_096 - 24;
            // As SQLite recomputes checksums at a commit: the frame read back, its header
            // (the commit frame's, here) written again.
            let mut header = [0_u8; 24];
            let read = methods.xRead.unwrap()(wal.cast(), header.as_mut_ptr().cast(), 24, last_frame);
            assert_eq!(read, ffi::SQLITE_OK);
            assert_ne!(header[4..8], [0, 0, 0, 0], "the last frame is a commit's");
            let before = writes_out();
            let written = methods.xWrite.unwrap()(wal.cast(), header.as_ptr().cast(), 24, last_frame);
            assert_eq!(written, ffi::SQLITE_OK);
            assert!((*(*wal).gathered).bytes.is_empty(), "written at once, not gathered");
            assert_eq!(writes_out(), before, "written as it came, not as something gathered");
        }
        insert(&db, 2, 100);
        assert_eq!(read_back(&path), (vec![(1, 100), (2, 100)], "ok".into()));
    }

    /// Set in the child process of the test below, which runs with a limit on file sizes.
    const FULL_DISK_CHILD: &str = "SB_WAL_WRITES_FULL_DISK_DIR";

    #[test]
    fn a_write_that_fails_fails_its_commit_and_leaves_the_database_whole() {
        if let Some(dir) = std::env::var_os(FULL_DISK_CHILD) {
            return fail_a_commit_in(Path::new(&dir));
        }
        // A limit on file sizes holds for the whole process: it runs in a process of its own
        // (this test binary, running only this test).
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "ledger::wal_writes::tests::a_write_that_fails_fails_its_commit_and_leaves_the_database_whole"])
            .args(["--nocapture", "--test-threads=1"])
            .env(FULL_DISK_CHILD, dir.path())
            .output()
            .unwrap();
        let log =
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "{log}");
        assert!(log.contains("1 passed"), "the child ran the test: {log}");
        // What the failed commit left, read by another process: the rows committed before
        // and after it, a whole file.
        assert_eq!(read_back(&dir.path().join("full.db")), (vec![(1, 100), (3, 100)], "ok".into()));
    }

    fn fail_a_commit_in(dir: &Path) {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        use nix::sys::signal::{SigHandler, Signal, signal};

        let path = dir.join("full.db");
        let db = writer(&path);
        insert(&db, 1, 100);
        // Beyond the limit, a write fails with EFBIG (as a full disk fails one with ENOSPC)
        // instead of the process being killed.
        // SAFETY: ignoring a signal installs no handler of ours.
        unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) }.unwrap();
        let (_, hard) = getrlimit(Resource::RLIMIT_FSIZE).unwrap();
        let wal_size = std::fs::metadata(dir.join("full.db-wal")).unwrap().len();
        setrlimit(Resource::RLIMIT_FSIZE, wal_size + 2_000, hard).unwrap();

        let before = writes_out();
        let failed = db.execute("INSERT INTO rows (id, name, body) VALUES (2, 'row 2', zeroblob(20000))", []);
        assert!(failed.is_err(), "a commit that could not be written succeeded: {failed:?}");
        assert_eq!(writes_out() - before, 1, "the commit failed on writing what it gathered");

        setrlimit(Resource::RLIMIT_FSIZE, hard, hard).unwrap();
        insert(&db, 3, 100);
        let count: i64 = db.query_row("SELECT count(*) FROM rows", [], |row| row.get(0)).unwrap();
        assert_eq!(count, 2, "the failed row is not there");
    }
}
