package outbox

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"nymph/atomicfile"
	"nymph/messages"
)

// The job journal is an append-only log beside the stored results
// (journal.log in the outbox's directory). Each accepted exec or run gets a
// "begin" record, written before the job's child process is spawned (from
// then on a daemon process that dies leaves it: the kernel has it) and
// fdatasynced in the background within journalSyncAfter, for a host that
// loses power (whose children die with it), and an "end" record once its outcome is accepted by the control plane or
// stored in the outbox, whichever comes first. A job with a begin and no end at start
// is one a dead process was running; Recover reports it. The journal sits
// with the outbox because the two are read together: an outcome the dead
// process stored wins over the journal's "outcome unknown".
//
// One log rather than a file per job: a begin costs one fdatasync on a
// file that exists, where a new file costs a file and a directory sync.
// The sync is off the spawn's path (it was a few hundred microseconds in
// front of every exec, measured), and the begins of journalSyncAfter share
// one: back-to-back execs paid a seventh of the daemon's CPU for a sync
// each. A host that loses power in that window loses the job with its
// children; the control plane, which the job's acknowledgement reached
// long before, resolves it as lost once the daemon is back. The log is emptied whenever no job
// is open and it has grown past journalCompactAt.
//
// A record is framed as a 4-byte big-endian length, the CRC-32C of the
// payload, and the payload (msgpack), so a torn tail (a crash mid-append,
// a full disk) or a garbled byte is recognised, never misread.

// Job kinds of the journal, as the daemon's ledger spells them.
const (
	JobExec = "exec"
	JobRun  = "run"
)

// JournalFile is the journal's name in the outbox's directory.
const JournalFile = "journal.log"

// Messages of the outcomes Recover posts.
const (
	RestartedExecMessage = "nymph restarted (the previous process died) while this exec was running; its outcome is unknown"
	RestartedRunMessage  = "nymph restarted (the previous process died) while this run was running; its outcome is unknown"
)

// journalSyncAfter is how long after a begin record its sync may come.
const journalSyncAfter = 50 * time.Millisecond

const (
	opBegin = "begin"
	opEnd   = "end"
	// maxRecord bounds one record's payload: far above any real one, so
	// a garbled length is taken for corruption, not allocated.
	maxRecord = 64 << 10
	// journalCompactAt is the size past which an idle journal is emptied.
	journalCompactAt = 64 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// JournalEntry is one journalled job.
type JournalEntry struct {
	Kind      string         `msgpack:"kind"`
	ID        string         `msgpack:"id"`
	CommandID string         `msgpack:"command_id"`
	At        messages.Epoch `msgpack:"at"`
}

// journalRecord is one record of the log.
type journalRecord struct {
	Op string `msgpack:"op"`
	// Key is the outbox key of the job's outcome ("exec:<id>", "ack:<id>").
	Key string `msgpack:"key"`
	// Job is set on begin records.
	Job *JournalEntry `msgpack:"job,omitempty"`
}

// resultKey is the outbox key of the outcome of job id of kind.
func resultKey(kind, id string) (string, error) {
	if id == "" {
		return "", errors.New("journal: empty job id")
	}
	switch kind {
	case JobExec:
		return "exec:" + id, nil
	case JobRun:
		return "ack:" + id, nil
	}
	return "", fmt.Errorf("journal: unknown job kind %q", kind)
}

// journal is the log and the set of jobs open in it.
type journal struct {
	path string
	log  zerolog.Logger

	mu     sync.Mutex
	f      *os.File // open for appending; nil until the first append
	size   int64
	open   map[string]JournalEntry
	closed bool
	// unsynced: a begin record was written since the last sync; syncing:
	// the syncer goroutine is on its way; inSync: it is in fdatasync, on
	// f, with mu released (synced is broadcast when it is out).
	unsynced, syncing, inSync bool
	synced                    *sync.Cond
	// fdatasync is unix.Fdatasync on the log's descriptor (tests hold it).
	fdatasync func(f *os.File) error
}

func newJournal(path string, log zerolog.Logger) *journal {
	j := &journal{path: path, log: log, open: map[string]JournalEntry{},
		fdatasync: func(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }}
	j.synced = sync.NewCond(&j.mu)
	return j
}

// begin appends a begin record, and has it synced in the background.
func (j *journal) begin(key string, e JournalEntry) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.append(journalRecord{Op: opBegin, Key: key, Job: &e}); err != nil {
		return err
	}
	j.open[key] = e
	j.unsynced = true
	if !j.syncing {
		j.syncing = true
		time.AfterFunc(journalSyncAfter, j.syncer)
	}
	return nil
}

// syncer syncs the log until no begin record is left unsynced. It lets
// j.mu go while it syncs: a sync takes milliseconds on some disks, and the
// begin or end of the next job, which would wait for it, is on that job's
// path (seen as execs stalled behind the syncer). Closing and replacing
// the file wait for the sync instead (waitSync); a record appended
// meanwhile is synced by this sync or the next.
func (j *journal) syncer() {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.unsynced && j.f != nil {
		j.unsynced = false
		f := j.f
		j.inSync = true
		j.mu.Unlock()
		err := j.fdatasync(f)
		j.mu.Lock()
		j.inSync = false
		j.synced.Broadcast()
		j.syncFailed(err)
	}
	j.unsynced = false
	j.syncing = false
}

// waitSync waits until no sync is in fdatasync; j.mu is held.
func (j *journal) waitSync() {
	for j.inSync {
		j.synced.Wait()
	}
}

// syncLocked fdatasyncs the log; j.mu is held and no sync is in progress.
func (j *journal) syncLocked() {
	if j.f == nil {
		return
	}
	j.syncFailed(j.fdatasync(j.f))
}

func (j *journal) syncFailed(err error) {
	if err != nil {
		j.log.Error().Err(err).Str("file", j.path).Msg("journal: sync failed; a host that loses power may forget jobs begun since the last one")
	}
}

// end appends an end record for key, if the job is open, unsynced: a
// record lost to a power cut makes the next start post "outcome unknown"
// for a job already reported, which the control plane takes as the repeat
// it is and ignores.
func (j *journal) end(key string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.open[key]; !ok {
		return
	}
	delete(j.open, key)
	if err := j.append(journalRecord{Op: opEnd, Key: key}); err != nil {
		j.log.Error().Err(err).Str("key", key).Str("file", j.path).Msg("journal: end record not written")
		return
	}
	if len(j.open) == 0 && j.size >= journalCompactAt {
		// Nothing open: the log says nothing the next start needs.
		if err := j.f.Truncate(0); err != nil {
			j.log.Warn().Err(err).Str("file", j.path).Msg("journal: not emptied")
			return
		}
		j.size = 0
	}
}

// append writes one record, unsynced; j.mu is held.
func (j *journal) append(r journalRecord) error {
	if j.closed {
		return errors.New("journal: closed")
	}
	if j.f == nil {
		f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("journal: %w", err)
		}
		// A new file's name must be durable before a record in it is.
		if err := atomicfile.SyncDir(filepath.Dir(j.path)); err != nil {
			f.Close()
			return fmt.Errorf("journal: %w", err)
		}
		j.f, j.size = f, st.Size()
	}
	buf, err := encodeRecord(r)
	if err != nil {
		return err
	}
	n, err := j.f.Write(buf)
	j.size += int64(n)
	if err != nil {
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	return nil
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	j.waitSync()
	if j.f == nil {
		return nil
	}
	if j.unsynced {
		j.unsynced = false
		j.syncLocked()
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// Begin journals job id of kind (JobExec, JobRun), carried by command
// commandID, and returns once the record is written: a daemon process
// that dies from then on leaves it for the next start. It reaches the disk
// moments later (an fdatasync in the background). The job leaves the
// journal when its outcome is posted or stored.
func (o *Outbox) Begin(kind, id, commandID string) error {
	key, err := resultKey(kind, id)
	if err != nil {
		return err
	}
	return o.jr.begin(key, JournalEntry{Kind: kind, ID: id, CommandID: commandID, At: messages.Epoch(time.Now().Unix())})
}

// endJob ends the journalled job whose outcome key names, if there is
// one: its outcome is stored, or was posted.
func (o *Outbox) endJob(key string) { o.jr.end(key) }

// ReadJournal returns the jobs open in the journal of the outbox in dir
// (begun and not ended), oldest first, without changing anything. A log
// that is torn or corrupt somewhere gives the jobs read before that point
// and an error saying where.
func ReadJournal(dir string) ([]JournalEntry, error) {
	open, _, err := readJournal(filepath.Join(dir, JournalFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return open, err
}

// readJournal reads the log at path: the open jobs, their keys, and an
// error if the log is unreadable or corrupt from some offset on.
func readJournal(path string) ([]JournalEntry, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var keys []string
	jobs := map[string]JournalEntry{}
	var off int64
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("journal %s: at byte %d: %s", path, off, fmt.Sprintf(format, args...))
	}
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF {
				break // a clean end
			}
			err = corrupt("torn record header: %v", err)
			return opened(keys, jobs), liveKeys(keys, jobs), err
		}
		n := binary.BigEndian.Uint32(hdr[0:4])
		if n == 0 || n > maxRecord {
			return opened(keys, jobs), liveKeys(keys, jobs), corrupt("record length %d", n)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return opened(keys, jobs), liveKeys(keys, jobs), corrupt("torn record: %v", err)
		}
		if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(hdr[4:8]) {
			return opened(keys, jobs), liveKeys(keys, jobs), corrupt("checksum mismatch")
		}
		var rec journalRecord
		if err := messages.Unmarshal(payload, &rec); err != nil {
			return opened(keys, jobs), liveKeys(keys, jobs), corrupt("%v", err)
		}
		switch rec.Op {
		case opBegin:
			if rec.Job == nil {
				return opened(keys, jobs), liveKeys(keys, jobs), corrupt("begin record without its job")
			}
			key, err := resultKey(rec.Job.Kind, rec.Job.ID)
			if err != nil || key != rec.Key {
				return opened(keys, jobs), liveKeys(keys, jobs), corrupt("begin record for %q does not fit its job (%v)", rec.Key, err)
			}
			if _, dup := jobs[key]; !dup {
				keys = append(keys, key)
			}
			jobs[key] = *rec.Job
		case opEnd:
			delete(jobs, rec.Key)
		default:
			return opened(keys, jobs), liveKeys(keys, jobs), corrupt("unknown record %q", rec.Op)
		}
		off += int64(8 + n)
	}
	return opened(keys, jobs), liveKeys(keys, jobs), nil
}

func liveKeys(keys []string, jobs map[string]JournalEntry) []string {
	var out []string
	for _, k := range keys {
		if _, ok := jobs[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

func opened(keys []string, jobs map[string]JournalEntry) []JournalEntry {
	var out []JournalEntry
	for _, k := range liveKeys(keys, jobs) {
		out = append(out, jobs[k])
	}
	return out
}

// Recover reports every job the journal holds without an outcome: a job a
// previous process of the daemon accepted and was running when it died.
// Each gets its outcome through the outbox, as any other result: an exec
// result with exit code -1 and RestartedExecMessage, a run ack failed with
// {type: DaemonRestarted}. A job whose outcome the previous process had
// stored already is left to that outcome. Call it once, after Open and
// before the first Begin, once whatever the dead process left running is
// ended. It returns the jobs it reported. A torn or corrupt journal is
// logged by name and set aside; the jobs read before the damage are
// reported all the same, and the daemon starts.
func (o *Outbox) Recover() ([]JournalEntry, error) {
	path := o.jr.path
	open, keys, err := readJournal(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		o.setAside(path, err, "corrupt job journal set aside; the jobs read before the damage are reported")
	}
	var out []JournalEntry
	for i, e := range open {
		key := keys[i]
		o.mu.Lock()
		_, stored := o.seen[key]
		o.mu.Unlock()
		log := o.log.With().Str("kind", e.Kind).Str("id", e.ID).Str("command_id", e.CommandID).Logger()
		if stored {
			log.Info().Msg("journalled job has a stored outcome; that one is posted")
			continue
		}
		log.Warn().Time("accepted_at", time.Unix(int64(e.At), 0)).
			Msg("job was running when the previous process died; reporting it as interrupted")
		// Open in this process's journal too, until its outcome is
		// posted (at once, normally) or stored.
		o.jr.reopen(key, e)
		if err := o.submitRestarted(e); err != nil {
			log.Error().Err(err).Msg("interrupted job's outcome not stored; posting from memory")
		}
		out = append(out, e)
	}
	// Every outcome is in the outbox now: a fresh log, holding the jobs
	// still open (an outcome neither posted nor stored yet).
	if err := o.jr.rewrite(); err != nil {
		return out, err
	}
	return out, nil
}

// reopen marks a job of the previous process's log open in this one.
func (j *journal) reopen(key string, e JournalEntry) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.open[key] = e
}

// rewrite replaces the log with one that holds the jobs open now.
func (j *journal) rewrite() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	// The new log is written whole and synced (atomicfile): nothing of
	// the old one is left to sync.
	j.waitSync()
	j.unsynced = false
	if j.f != nil {
		_ = j.f.Close()
		j.f = nil
	}
	var data []byte
	for key, e := range j.open {
		frame, err := encodeRecord(journalRecord{Op: opBegin, Key: key, Job: &e})
		if err != nil {
			return err
		}
		data = append(data, frame...)
	}
	if err := atomicfile.Write(j.path, data, 0o600); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// encodeRecord frames one record: length, CRC-32C, payload.
func encodeRecord(r journalRecord) ([]byte, error) {
	payload, err := messages.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	buf := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint32(buf[0:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(buf[4:8], crc32.Checksum(payload, castagnoli))
	return append(buf, payload...), nil
}

// submitRestarted submits the "outcome unknown" of an interrupted job.
func (o *Outbox) submitRestarted(e JournalEntry) error {
	if e.Kind == JobExec {
		msg := RestartedExecMessage
		return o.ExecResult(e.ID, &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &msg})
	}
	return o.Ack(&messages.Ack{InvocationID: e.ID, State: messages.StateFailed,
		Error: &messages.AckError{Type: messages.ErrorTypeDaemonRestarted, Message: RestartedRunMessage}})
}

// setAside renames a file that cannot be read to <name>.corrupt-<unix> and
// logs both names: a crash mid-write or a full disk must not stop the
// daemon from starting, and what the file held is kept for a human.
func (o *Outbox) setAside(path string, cause error, msg string) {
	aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().Unix())
	ev := o.log.Error().Err(cause).Str("file", path)
	if err := os.Rename(path, aside); err != nil {
		// Left in place it would be read again at every start; gone is
		// better than that.
		ev = ev.AnErr("rename_error", err)
		if rerr := os.Remove(path); rerr != nil {
			ev = ev.AnErr("remove_error", rerr)
		}
		ev.Msg(msg + " (could not be renamed; removed)")
		return
	}
	ev.Str("moved_to", aside).Msg(msg)
}
