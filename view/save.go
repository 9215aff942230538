package view

import (
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
	"weak"

	"github.com/etcdwatch/etcdwatch"
	"github.com/etcdwatch/etcdwatch/internal/cow"
)

// raws are the values of a state by key as the server sent them, beside its
// entries, for Save: a view keeps them only when it saves (WithSave,
// WithStateFile), as a second copy-on-write map that shares the value
// buffers with the entries (a Decoder of a saving view must not modify
// them). The zero raws keeps nothing and its methods do nothing, so that
// other views pay nothing. Owned by the goroutine editing the state, as the
// entries' editor is.
type raws struct{ ed *cow.Editor[[]byte] }

// editRaws returns the raws of a state that starts as base's, for a view
// that keeps them.
func editRaws[T any](o options, base *Snapshot[T]) raws {
	if !o.warm.keep {
		return raws{}
	}
	return raws{base.raw.Edit()}
}

func (k raws) set(key string, v []byte) {
	if k.ed != nil {
		k.ed.Set(key, v)
	}
}

// add adds a key after every key held, as Editor.Append.
func (k raws) add(key string, v []byte) {
	if k.ed != nil {
		k.ed.Append(key, v)
	}
}

func (k raws) delete(key string) {
	if k.ed != nil {
		k.ed.Delete(key)
	}
}

// freeze returns the raws as they are, for a Snapshot; the zero Map for a
// view that keeps none.
func (k raws) freeze() cow.Map[[]byte] {
	if k.ed == nil {
		return cow.Map[[]byte]{}
	}
	return k.ed.Map()
}

// Save writes the view's current Snapshot to w in the form WithRestore and
// WithStateFile read: every key with its value as the server sent it and
// its revisions, the range, the revision and the ID of the cluster it came
// from, with checksums. The view must keep its values as sent: WithSave (or
// WithStateFile), or Save fails with an error wrapping
// etcdwatch.ErrInvalidArgument. Save reads an immutable state and never
// holds the view up; it returns w's first error.
func (v *View[T]) Save(w io.Writer) error {
	if !v.core.opts.warm.keep {
		return fmt.Errorf("%w: View.Save needs a view made WithSave or WithStateFile", etcdwatch.ErrInvalidArgument)
	}
	return v.core.save(w, v.Snapshot())
}

func (c *core[T]) save(w io.Writer, s *Snapshot[T]) error {
	h := stateHeader{
		cluster:  s.cluster,
		revision: s.rev,
		count:    uint64(s.Len()),
		key:      c.req.Key,
		end:      c.req.End,
	}
	var skew error
	err := writeState(w, h, func(yield func(*savedEntry) bool) { skew = savedEntries(s, yield) })
	if skew != nil { // a bug: say so rather than what it made writeState see
		return skew
	}
	return err
}

// savedEntries yields s's entries with their values as sent, walking the
// entries and the raws side by side: they hold the same keys, or it stops
// with an error.
func savedEntries[T any](s *Snapshot[T], yield func(*savedEntry) bool) error {
	next, stop := iter.Pull2(s.raw.All())
	defer stop()
	var e savedEntry
	for k, en := range s.m.All() {
		rk, raw, ok := next()
		if !ok || rk != k {
			return fmt.Errorf("etcdwatch/view: saving: no value as sent for %q (found %q): the view's two maps are out of step", k, rk)
		}
		e = savedEntry{key: k, value: raw, create: en.CreateRevision, mod: en.ModRevision, version: en.Version, lease: en.Lease}
		if !yield(&e) {
			return nil
		}
	}
	return nil
}

// saveLoop saves the state to WithStateFile's file every interval while
// the state runs; a state that never moved is not written again. Started
// once the first state is published; returns when the state's context
// ends (start waits, then makes the last save: endWarm).
func (c *core[T]) saveLoop() {
	tick, stop := ticker(c.opts.warm.every)
	defer stop()
	for {
		select {
		case <-tick:
			c.saveFile()
		case <-c.ctx.Done():
			return
		}
	}
}

// startSaving starts saveLoop for a view with WithStateFile; its first
// state is published.
func (c *core[T]) startSaving() {
	if c.opts.warm.path != "" {
		c.tasks.Go(c.saveLoop) // returns when ctx ends; start waits
	}
}

// saveFile writes the published state to the file, unless it is the state
// last written; a failure is logged and counted, and tried again next time.
func (c *core[T]) saveFile() {
	s := c.snap.Load()
	if weak.Make(s) == c.warm.lastSaved {
		return
	}
	began := time.Now()
	removeLeftovers(c.opts.warm.path, began)
	err := writeFile(c.opts.warm.path, func(w io.Writer) error { return c.save(w, s) })
	if err != nil {
		c.warm.saveFailures.Add(1)
		c.log.Warn("etcdwatch: view could not save its state", "path", c.opts.warm.path, "revision", s.rev, "err", err)
		return
	}
	c.warm.lastSaved = weak.Make(s)
	c.log.Debug("etcdwatch: view saved its state", "path", c.opts.warm.path, "revision", s.rev, "keys", s.Len(), "took", time.Since(began))
}

// writeFile replaces the file at path with what write writes, atomically:
// into a temporary file of its own beside it (path's name, a random part,
// ".tmp"), synced to the disk, then renamed over path, and the directory
// synced so that the rename lasts. A crash at any point leaves either the
// old file or the new one whole at path, and perhaps that temporary file.
// Two savers of one path (two processes, as in a rollout) each write their
// own: the last rename wins, whole. The new file has the mode of the one
// it replaces, or 0600.
func writeFile(path string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if fi, err := os.Stat(path); err == nil { // the file it replaces keeps its mode; a new one is 0600
		if err := f.Chmod(fi.Mode().Perm()); err != nil {
			return err
		}
	}
	if err := write(f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// leftoverAge is how long a temporary file of writeFile's must have gone
// unmodified to be taken for one a crash left behind: a save writes to its
// own all along, and renames it within moments of its last write.
const leftoverAge = time.Minute

// removeLeftovers removes the temporary files of writeFile's beside path
// (path's name, a random number, ".tmp") that no save has modified for
// leftoverAge at now: each crash during a save leaves one, as large as the
// state, and a process that crashes as it saves, again and again, would
// fill its disk with them. Another process's save in progress (a rollout's
// overlap) is writing its own, and is left alone. Best effort: what cannot
// be read or removed is left.
func removeLeftovers(path string, now time.Time) {
	dir, prefix := filepath.Dir(path), filepath.Base(path)+"."
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !isLeftover(e.Name(), prefix) || !e.Type().IsRegular() {
			continue
		}
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) >= leftoverAge {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// isLeftover reports whether name is prefix, decimal digits (os.CreateTemp's
// random part) and ".tmp".
func isLeftover(name, prefix string) bool {
	random, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	random, ok = strings.CutSuffix(random, ".tmp")
	return ok && random != "" && strings.Trim(random, "0123456789") == ""
}

// syncDir makes a rename in dir last. Windows cannot open a directory to
// sync it.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
