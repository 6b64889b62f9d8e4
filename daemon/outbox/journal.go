package outbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"nymph/atomicfile"
	"nymph/messages"
)

// The job journal: one file per accepted exec or run, written before the
// job's child process is spawned and removed once the job's outcome is
// stored in the outbox (or, when it could not be stored, posted). A file
// left in the journal at start is a job a dead process was running; Recover
// reports it. The journal sits inside the outbox's directory because the
// two are read together: an outcome stored by the dead process wins over
// the journal's "outcome unknown".

// Job kinds of the journal, as the daemon's ledger spells them.
const (
	JobExec = "exec"
	JobRun  = "run"
)

// journalDir is the journal's directory under the outbox's.
const journalDir = "journal"

// Messages of the outcomes Recover posts.
const (
	RestartedExecMessage = "nymph restarted (the previous process died) while this exec was running; its outcome is unknown"
	RestartedRunMessage  = "nymph restarted (the previous process died) while this run was running; its outcome is unknown"
)

// JournalEntry is one journalled job.
type JournalEntry struct {
	Kind      string         `msgpack:"kind"`
	ID        string         `msgpack:"id"`
	CommandID string         `msgpack:"command_id"`
	At        messages.Epoch `msgpack:"at"`
	// File is where the entry was read from (Recover's answer only).
	File string `msgpack:"-"`
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

// Begin journals job id of kind (JobExec, JobRun), carried by command
// commandID, and returns once the entry is on disk. The entry goes when
// the job's outcome is submitted and stored.
func (o *Outbox) Begin(kind, id, commandID string) error {
	key, err := resultKey(kind, id)
	if err != nil {
		return err
	}
	file := filepath.Join(o.dir, journalDir, fileName(key))
	data, err := messages.Marshal(&JournalEntry{Kind: kind, ID: id, CommandID: commandID, At: messages.Epoch(time.Now().Unix())})
	if err != nil {
		return fmt.Errorf("journal %s: %w", key, err)
	}
	if err := atomicfile.Write(file, data, 0o600); err != nil {
		return fmt.Errorf("journal %s: %w", key, err)
	}
	o.mu.Lock()
	o.journalled[key] = file
	o.mu.Unlock()
	return nil
}

// endJob drops the journal entry of the job whose outcome key names, if it
// has one: the outcome is stored, or was posted.
func (o *Outbox) endJob(key string) {
	o.mu.Lock()
	file, ok := o.journalled[key]
	delete(o.journalled, key)
	o.mu.Unlock()
	if !ok {
		return
	}
	// Not synced: a removal lost to a power cut makes the next start post
	// "outcome unknown" for a job already reported, which the control
	// plane takes as the repeat it is and ignores.
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		o.log.Error().Err(err).Str("key", key).Str("file", file).Msg("remove journal entry")
	}
}

// Recover reports every job the journal holds without an outcome: a job a
// previous process of the daemon accepted and was running when it died.
// Each gets its outcome through the outbox, as any other result: an exec
// result with exit code -1 and RestartedExecMessage, a run ack failed with
// {type: DaemonRestarted}. A job whose outcome the previous process had
// stored already is only dropped from the journal. Call it once, after
// Open, and after whatever the dead process left running is ended. It
// returns the jobs it reported; a corrupt entry is set aside and logged,
// never an error.
func (o *Outbox) Recover() ([]JournalEntry, error) {
	dir := filepath.Join(o.dir, journalDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var out []JournalEntry
	for _, de := range entries {
		name := de.Name()
		full := filepath.Join(dir, name)
		if strings.HasPrefix(name, ".") {
			_ = os.Remove(full) // a torn temporary of atomicfile
			continue
		}
		if !strings.HasSuffix(name, ".msgpack") {
			continue
		}
		e, key, err := readEntry(full)
		if err != nil {
			o.setAside(full, err, "corrupt journal entry set aside; the job it held, if any, cannot be reported")
			continue
		}
		o.mu.Lock()
		_, stored := o.seen[key]
		if !stored {
			o.journalled[key] = full
		}
		o.mu.Unlock()
		log := o.log.With().Str("kind", e.Kind).Str("id", e.ID).Str("command_id", e.CommandID).Logger()
		if stored {
			log.Info().Msg("journalled job has a stored outcome; that one is posted")
			_ = os.Remove(full)
			continue
		}
		log.Warn().Time("accepted_at", time.Unix(int64(e.At), 0)).
			Msg("job was running when the previous process died; reporting it as interrupted")
		if err := o.submitRestarted(e); err != nil {
			log.Error().Err(err).Msg("interrupted job's outcome not stored; posting from memory")
		}
		e.File = full
		out = append(out, e)
	}
	return out, nil
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

func readEntry(path string) (JournalEntry, string, error) {
	var e JournalEntry
	data, err := os.ReadFile(path)
	if err != nil {
		return e, "", err
	}
	if err := messages.Unmarshal(data, &e); err != nil {
		return e, "", err
	}
	key, err := resultKey(e.Kind, e.ID)
	return e, key, err
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
