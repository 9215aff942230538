package view

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/etcdwatch/etcdwatch"
)

// crashEnv names the file a child of TestCrashWhileSaving saves to.
const crashEnv = "ETCDWATCH_VIEW_CRASH_PATH"

// newerState is the state the crashing save writes: another revision.
func newerState(t testing.TB) []byte {
	h, es := sampleState()
	h.revision = 41
	return encodeState(t, h, es)
}

// TestCrashWhileSaving: a process killed halfway through saving its state
// leaves the file it saves to as it was, whole and loadable; the next save
// replaces it, and the half-written temporary file. Catches: a save that
// writes into the file itself, or renames before it has written all.
func TestCrashWhileSaving(t *testing.T) {
	if path := os.Getenv(crashEnv); path != "" {
		crashingSave(t, path)
		return
	}
	path := filepath.Join(t.TempDir(), "state")
	h, es := sampleState()
	old := encodeState(t, h, es)
	require.NoError(t, writeFile(path, func(w io.Writer) error {
		_, err := w.Write(old)
		return err
	}))

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWhileSaving$")
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	said := make(chan string, 1)
	go func() { // returns when the child's stdout ends: it is killed below
		line, _ := bufio.NewReader(out).ReadString('\n')
		said <- line
	}()
	select {
	case line := <-said:
		require.Equal(t, "writing\n", line)
	case <-time.After(wait):
		cmd.Process.Kill()
		t.Fatal("the child did not start writing")
	}
	require.NoError(t, cmd.Process.Kill())
	require.Error(t, cmd.Wait(), "killed")

	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, old, got, "the file as it was")
	_, _, err = decodeState(bytes.NewReader(got))
	require.NoError(t, err)
	tmps := temporaries(t, path)
	require.Len(t, tmps, 1, "the child was killed in its temporary file")
	half, err := os.ReadFile(tmps[0])
	require.NoError(t, err)
	require.Equal(t, newerState(t)[:len(half)], half)

	newer := newerState(t)
	require.NoError(t, writeFile(path, func(w io.Writer) error {
		_, err := w.Write(newer)
		return err
	}))
	got, err = os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, newer, got)
	require.Len(t, temporaries(t, path), 1, "the crashed save's, left; none of this one's")
}

// temporaries returns the temporary files of saves to path.
func temporaries(t *testing.T, path string) []string {
	t.Helper()
	tmps, err := filepath.Glob(path + ".*.tmp")
	require.NoError(t, err)
	return tmps
}

// TestTwoSaversOfOnePath: two saves to one path at once, one stalled
// halfway while the other completes, leave the last one's file, whole.
// Catches: a temporary file shared by both, into which the stalled one
// writes its second half after the other renamed it over path.
func TestTwoSaversOfOnePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	h, es := sampleState()
	first, second := newerState(t), encodeState(t, h, es)
	halfway, resume, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- writeFile(path, func(w io.Writer) error {
			if _, err := w.Write(first[:len(first)/2]); err != nil {
				return err
			}
			close(halfway)
			<-resume
			_, err := w.Write(first[len(first)/2:])
			return err
		})
	}()
	<-halfway
	require.NoError(t, writeFile(path, func(w io.Writer) error {
		_, err := w.Write(second)
		return err
	}))
	close(resume)
	require.NoError(t, <-done)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, first, got, "the last rename's state, whole")
	require.Empty(t, temporaries(t, path))
}

// crashingSave is the child of TestCrashWhileSaving: it writes half of a
// newer state, says so, and waits to be killed.
func crashingSave(t *testing.T, path string) {
	b := newerState(t)
	_ = writeFile(path, func(w io.Writer) error {
		if _, err := w.Write(b[:len(b)/2]); err != nil {
			return err
		}
		if f, ok := w.(*os.File); ok {
			f.Sync() // the half is on the disk, as a crash would find it
		}
		fmt.Println("writing")
		time.Sleep(time.Hour) // killed here
		return nil
	})
	t.Fatal("not killed")
}

// TestFailedSave: a save whose writing fails leaves the file as it was and
// no temporary file.
func TestFailedSave(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	h, es := sampleState()
	old := encodeState(t, h, es)
	require.NoError(t, writeFile(path, func(w io.Writer) error {
		_, err := w.Write(old)
		return err
	}))
	err := writeFile(path, func(w io.Writer) error {
		w.Write(newerState(t)[:100])
		return errDiskFull
	})
	require.ErrorIs(t, err, errDiskFull)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, old, got)
	require.Empty(t, temporaries(t, path), "removed")
}

// wait bounds the waits of the package's own tests.
const wait = 10 * time.Second

// TestSaveDoesNotHoldTheStateItSaved: the save loop remembers the state it
// last wrote, so as not to write it again, without keeping it alive once
// a newer one is published (its entries and values, up to a whole state's
// worth under churn). Catches: a strong reference, which kept the saved
// state until the next save.
func TestSaveDoesNotHoldTheStateItSaved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	c := &core[[]byte]{opts: options{warm: warmOptions{keep: true, path: path, pathSet: true}}, log: slog.New(slog.DiscardHandler), req: etcdwatch.Prefix("v/")}
	saved := &Snapshot[[]byte]{rev: 1}
	collected := make(chan struct{})
	runtime.AddCleanup(saved, func(ch chan struct{}) { close(ch) }, collected)
	c.snap.Store(saved)
	c.saveFile()
	require.Zero(t, c.warm.saveFailures.Load())
	written, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	c.saveFile() // the same state: not written again
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "written again (it was %d bytes)", written.Size())

	c.snap.Store(&Snapshot[[]byte]{rev: 2}) // a newer state, not saved yet
	saved = nil
	defer runtime.KeepAlive(c) // the view's state lives on
	for deadline := time.After(wait); ; {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-deadline:
			t.Fatal("the state saved, since replaced, is kept alive")
		case <-time.After(10 * time.Millisecond): // the cleanup runs after a GC, on a goroutine of its own
		}
	}
}

// TestSaveKeepsTheModeOfTheFileItReplaces: a save replaces the state file
// with a file of the same mode (a new one is 0600, as CreateTemp makes it).
func TestSaveKeepsTheModeOfTheFileItReplaces(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix modes")
	}
	path := filepath.Join(t.TempDir(), "v.state")
	save := func() {
		t.Helper()
		require.NoError(t, writeFile(path, func(w io.Writer) error { _, err := w.Write([]byte("x")); return err }))
	}
	save()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "a new file")
	require.NoError(t, os.Chmod(path, 0o644))
	save()
	fi, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), fi.Mode().Perm(), "the mode of the file replaced")
}
