package view

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"
)

// encodeState is writeState into a buffer.
func encodeState(t testing.TB, h stateHeader, es []savedEntry) []byte {
	var b bytes.Buffer
	h.count = uint64(len(es))
	err := writeState(&b, h, func(yield func(*savedEntry) bool) {
		for i := range es {
			if !yield(&es[i]) {
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// decodeState is the loader: readHeader, then readEntries.
func decodeState(r io.Reader) (stateHeader, []savedEntry, error) {
	return decodeLent(r, false)
}

// decodeLent is decodeState with entries lent by the reader when lend is
// set, each copied at once (as relistSaved copies those it keeps).
func decodeLent(r io.Reader, lend bool) (stateHeader, []savedEntry, error) {
	sr, h, err := readHeader(r)
	if err != nil {
		return h, nil, err
	}
	var es []savedEntry
	err = sr.readEntries(h, lend, func(e savedEntry) bool {
		if lend {
			kv := bytes.Clone(e.kv)
			e.kv = kv[:len(kv):len(kv)]
			e.value = e.kv[len(e.key):]
		}
		es = append(es, e)
		return true
	})
	return h, es, err
}

// sampleState is a state of range p/..p0 at revision 40: an empty value, a
// value larger than the writer's buffer, binary bytes, a lease.
func sampleState() (stateHeader, []savedEntry) {
	h := stateHeader{cluster: 0xfeedface_cafe0001, revision: 40, key: []byte("p/"), end: []byte("p0")}
	big := bytes.Repeat([]byte("0123456789abcdef"), flushAt/16+100)
	es := []savedEntry{
		{key: "p/", value: []byte{}, create: 2, mod: 2, version: 1},
		{key: "p/a", value: []byte("alpha"), create: 3, mod: 17, version: 4, lease: 0x7a},
		{key: "p/b\x00\xff", value: []byte{0, 1, 2, 255}, create: 5, mod: 5, version: 1},
		{key: "p/big", value: big, create: 6, mod: 39, version: 2},
		{key: "p/z", value: []byte("last"), create: 40, mod: 40, version: 1, lease: -3},
	}
	return h, es
}

// requireSameEntries compares entries by what a state keeps of them.
func requireSameEntries(t *testing.T, want, got []savedEntry) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		w, g := want[i], got[i]
		require.Equal(t, w.key, g.key)
		require.Equal(t, string(w.value), string(g.value), w.key)
		require.Equal(t, []int64{w.create, w.mod, w.version, w.lease}, []int64{g.create, g.mod, g.version, g.lease}, w.key)
		require.Equal(t, w.key+string(w.value), string(g.kv), "key and value in one buffer")
		require.Equal(t, len(g.value), cap(g.value), "a value's buffer is its own: appending copies")
	}
}

// TestStateRoundTrip: what writeState writes, the loader reads back as it
// was, through readers that give a byte at a time or fail with the last
// bytes; an empty state too. Catches: a field lost or swapped, a value
// split across the buffer's refills, a large value written apart, a length
// off by one, values sharing a buffer.
func TestStateRoundTrip(t *testing.T) {
	h, es := sampleState()
	file := encodeState(t, h, es)
	for name, r := range map[string]func() io.Reader{
		"whole":    func() io.Reader { return bytes.NewReader(file) },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(file)) },
		"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(file)) },
		"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(file)) },
		"lent":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(file)) },
	} {
		t.Run(name, func(t *testing.T) {
			got, ges, err := decodeLent(r(), name == "lent")
			require.NoError(t, err)
			require.Equal(t, h.cluster, got.cluster)
			require.Equal(t, h.revision, got.revision)
			require.EqualValues(t, len(es), got.count)
			require.Equal(t, "p/", string(got.key))
			require.Equal(t, "p0", string(got.end))
			requireSameEntries(t, es, ges)
		})
	}
	empty := encodeState(t, stateHeader{cluster: 1, revision: 1, key: []byte("k")}, nil)
	got, ges, err := decodeState(bytes.NewReader(empty))
	require.NoError(t, err)
	require.Empty(t, ges)
	require.Empty(t, got.end)
	require.Equal(t, "k", string(got.key))
}

// TestLentEntriesSurviveTheirRevisions: a lent entry's key and value are
// a slice of the reader's buffer, which a refill moves. Reading the
// revisions after them refilled it when fewer than a varint's bytes were
// left, and the value a Relisted batch decodes as Prev was another
// entry's (checksums computed before the move held). States of 6,000
// entries (about 700 KB, three buffers), each first value longer by one
// byte than the last's, put a buffer's end at every place of an entry.
func TestLentEntriesSurviveTheirRevisions(t *testing.T) {
	for pad := 100; pad < 220; pad++ {
		h := stateHeader{cluster: 1, revision: 1 << 40, key: []byte("p/"), end: []byte("p0")}
		es := make([]savedEntry, 6000)
		for i := range es {
			es[i] = savedEntry{key: fmt.Sprintf("p/%06d", i), value: bytes.Repeat([]byte{byte('a' + i%26)}, 100),
				create: 1 << 30, mod: 1<<30 + int64(i), version: 1 << 20, lease: 1 << 35}
		}
		es[0].value = bytes.Repeat([]byte{'z'}, pad)
		file := encodeState(t, h, es)
		sr, hh, err := readHeader(bytes.NewReader(file))
		require.NoError(t, err)
		i := 0
		err = sr.readEntries(hh, true, func(e savedEntry) bool {
			if !bytes.Equal(e.value, es[i].value) {
				t.Fatalf("pad %d: entry %d (%s): lent value %.12q..., want %.12q...", pad, i, e.key, e.value, es[i].value)
			}
			i++
			return true
		})
		require.NoError(t, err)
		require.Equal(t, len(es), i)
	}
}

// TestStateWriterErrors: the writer returns the first error of its
// io.Writer, and refuses entries that are not what the header says.
func TestStateWriterErrors(t *testing.T) {
	h, es := sampleState()
	h.count = uint64(len(es))
	full := encodeState(t, h, es)
	for _, n := range []int{0, 10, len(full) / 2, len(full) - 1} {
		w := &failAfter{n: n}
		err := writeState(w, h, func(yield func(*savedEntry) bool) {
			for i := range es {
				if !yield(&es[i]) {
					return
				}
			}
		})
		require.ErrorIs(t, err, errDiskFull, "failing after %d bytes", n)
	}
	h.count++
	err := writeState(io.Discard, h, func(yield func(*savedEntry) bool) {
		for i := range es {
			yield(&es[i])
		}
	})
	require.ErrorContains(t, err, "entries")
}

var errDiskFull = errors.New("disk full")

// failAfter takes n bytes, then fails.
type failAfter struct{ n int }

func (w *failAfter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		k := w.n
		w.n = 0
		return k, errDiskFull
	}
	w.n -= len(p)
	return len(p), nil
}

// resum sets both checksums of a saved state to what its bytes sum to,
// where its header's length allows, so that the loader's other checks can
// be reached with bytes a test or the fuzzer made.
func resum(b []byte) []byte {
	const fixed = len(stateMagic) + 8
	if len(b) < fixed {
		return b
	}
	b = bytes.Clone(b)
	hend := fixed + int(binary.LittleEndian.Uint32(b[len(stateMagic)+4:]))
	if hend < fixed || hend+8 > len(b) {
		return b
	}
	hcrc := crc32.Checksum(b[:hend], castagnoli)
	binary.LittleEndian.PutUint32(b[hend:], hcrc)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Update(hcrc, castagnoli, b[hend+4:len(b)-4]))
	return b
}

// TestStateLoaderRefuses: every kind of bad input is refused with its
// sentinel, each from bytes of its own: a file cut at any length, a bit
// flipped anywhere, bytes after the end, another format version, not a
// state at all; and, checksums made right, what only a broken writer could
// write: keys out of order or outside the range, revisions after the
// state's, a non-canonical length. Catches: a loader that skips one of its
// checks, or that takes a prefix of a state for a state.
func TestStateLoaderRefuses(t *testing.T) {
	h, es := sampleState()
	file := encodeState(t, h, es)
	bigAt := bytes.Index(file, es[3].value)
	small := encodeState(t, h, append(es[:3:3], es[4])) // every byte of it is tried
	refused := func(t *testing.T, b []byte, is error, what string) {
		t.Helper()
		for _, lend := range []bool{false, true} {
			_, _, err := decodeLent(bytes.NewReader(b), lend)
			require.ErrorIs(t, err, is, "%s (lent: %v)", what, lend)
		}
	}
	// every position of small; in file, around the large value and its ends
	positions := func(b []byte) []int {
		if len(b) == len(small) {
			var all []int
			for i := range b {
				all = append(all, i)
			}
			return all
		}
		return []int{bigAt - 1, bigAt, bigAt + 1, bigAt + flushAt, bigAt + len(es[3].value) - 1, len(b) - 5, len(b) - 1}
	}
	t.Run("truncated", func(t *testing.T) {
		for _, b := range [][]byte{small, file} {
			for _, n := range positions(b) {
				refused(t, b[:n], ErrSavedCorrupt, fmt.Sprintf("cut at %d of %d", n, len(b)))
			}
		}
	})
	t.Run("corrupted", func(t *testing.T) {
		for _, f := range [][]byte{small, file} {
			for _, i := range positions(f) {
				b := bytes.Clone(f)
				b[i] ^= 1 << (i % 8)
				refused(t, b, ErrSavedCorrupt, fmt.Sprintf("bit %d of byte %d of %d flipped", i%8, i, len(f)))
			}
		}
	})
	t.Run("data after the end", func(t *testing.T) {
		refused(t, append(bytes.Clone(file), 0), ErrSavedCorrupt, "a byte more")
		refused(t, append(bytes.Clone(file), file...), ErrSavedCorrupt, "twice")
	})
	t.Run("not a state", func(t *testing.T) {
		refused(t, []byte(strings.Repeat("config: yes\n", 100)), ErrSavedCorrupt, "text")
		refused(t, nil, ErrSavedCorrupt, "empty")
	})
	t.Run("another version", func(t *testing.T) {
		for _, v := range []uint32{0, 2, 1 << 31} {
			b := bytes.Clone(file)
			binary.LittleEndian.PutUint32(b[len(stateMagic):], v)
			refused(t, resum(b), ErrSavedVersion, fmt.Sprintf("version %d", v))
			refused(t, b, ErrSavedCorrupt, fmt.Sprintf("version %d, header checksum not made right", v))
		}
	})
	t.Run("what a broken writer writes", func(t *testing.T) {
		for name, change := range map[string]func(h *stateHeader, es []savedEntry) []savedEntry{
			"keys out of order": func(_ *stateHeader, es []savedEntry) []savedEntry {
				es[1], es[2] = es[2], es[1]
				return es
			},
			"a key twice": func(_ *stateHeader, es []savedEntry) []savedEntry { return append(es[:2], es[1:]...) },
			"a key before the range": func(_ *stateHeader, es []savedEntry) []savedEntry {
				return append([]savedEntry{{key: "a", value: []byte("x"), create: 1, mod: 1, version: 1}}, es...)
			},
			"a key past the range": func(_ *stateHeader, es []savedEntry) []savedEntry {
				return append(es, savedEntry{key: "p0", value: []byte("x"), create: 1, mod: 1, version: 1})
			},
			"a change after the state's revision": func(h *stateHeader, es []savedEntry) []savedEntry {
				h.revision = 39
				return es
			},
			"created after modified": func(_ *stateHeader, es []savedEntry) []savedEntry {
				es[1].create = es[1].mod + 1
				return es
			},
			"version 0": func(_ *stateHeader, es []savedEntry) []savedEntry {
				es[1].version = 0
				return es
			},
			"revision 0": func(h *stateHeader, es []savedEntry) []savedEntry {
				h.revision = 0
				return nil
			},
		} {
			h, es := sampleState()
			es = change(&h, es)
			refused(t, encodeState(t, h, es), ErrSavedCorrupt, name)
		}
		// A length in two bytes where one does: the same numbers, another
		// form, which re-encoding would not give back.
		h := stateHeader{cluster: 1, revision: 5, key: []byte("k")}
		b := encodeState(t, h, []savedEntry{{key: "k", value: []byte("v"), create: 5, mod: 5, version: 1}})
		at := bytes.Index(b, []byte{1, 1, 'k', 'v'}) // klen, vlen, key, value
		require.Positive(t, at)
		long := slicesConcat(b[:at], []byte{0x81, 0x00}, b[at+1:])
		refused(t, resum(long), ErrSavedCorrupt, "a non-canonical length")
	})
	t.Run("a false length", func(t *testing.T) {
		h := stateHeader{cluster: 1, revision: 5, key: []byte("k")}
		b := encodeState(t, h, []savedEntry{{key: "k", value: []byte("v"), create: 5, mod: 5, version: 1}})
		at := bytes.Index(b, []byte{1, 1, 'k', 'v'})
		huge := slicesConcat(b[:at+1], binary.AppendUvarint(nil, 1<<60), b[at+2:])
		refused(t, resum(huge), ErrSavedCorrupt, "a value of 2^60 bytes in a small file")
	})
}

func slicesConcat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestStateReadError: an error reading the input is returned as it is, not
// taken for a corrupted state.
func TestStateReadError(t *testing.T) {
	h, es := sampleState()
	file := encodeState(t, h, es)
	for _, n := range []int{5, len(file) / 2} {
		r := io.MultiReader(bytes.NewReader(file[:n]), iotest.ErrReader(errDiskFull))
		_, _, err := decodeState(r)
		require.ErrorIs(t, err, errDiskFull)
		require.NotErrorIs(t, err, ErrSavedCorrupt)
	}
}

// FuzzLoad: the loader never panics, and whatever it accepts is exactly
// what the writer writes for what it read (the form is canonical), with
// keys ascending in the range and no change after the state's revision;
// lending its buffer or not, it accepts and reads the same. The inputs go
// in as they are and with their checksums made right, so that the checks
// behind the checksums are reached.
func FuzzLoad(f *testing.F) {
	h, es := sampleState()
	f.Add(encodeState(f, h, append(es[:3:3], es[4])), false) // small inputs: the fuzzer minimizes what it finds
	f.Add(encodeState(f, stateHeader{cluster: 1, revision: 1, key: []byte("k")}, nil), false)
	small := stateHeader{cluster: 7, revision: 9, key: []byte("a"), end: []byte{0}}
	f.Add(encodeState(f, small, []savedEntry{{key: "a", value: []byte("1"), create: 2, mod: 3, version: 2, lease: 5}, {key: "b", create: 9, mod: 9, version: 1}}), true)
	f.Fuzz(func(t *testing.T, b []byte, fix bool) {
		if fix {
			b = resum(b)
		}
		h, es, err := decodeState(bytes.NewReader(b))
		_, lent, lerr := decodeLent(bytes.NewReader(b), true)
		if (err == nil) != (lerr == nil) || !sameEntries(es, lent) {
			t.Fatalf("lent: %v, %d entries; copied: %v, %d entries", lerr, len(lent), err, len(es))
		}
		if err != nil {
			if !errors.Is(err, ErrSavedCorrupt) && !errors.Is(err, ErrSavedVersion) {
				t.Fatalf("refused without a sentinel: %v", err)
			}
			return
		}
		for i, e := range es {
			if (i > 0 && e.key <= es[i-1].key) || !inRange(h.key, h.end, e.key) || e.mod > h.revision || e.create > e.mod {
				t.Fatalf("accepted entry %d: %+v in %+v", i, e, h)
			}
		}
		if again := encodeState(t, h, es); !bytes.Equal(again, b) {
			t.Fatalf("accepted %x, which writes as %x", b, again)
		}
	})
}

func sameEntries(a, b []savedEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.key != y.key || !bytes.Equal(x.kv, y.kv) || !bytes.Equal(x.value, y.value) || x.create != y.create || x.mod != y.mod || x.version != y.version || x.lease != y.lease {
			return false
		}
	}
	return true
}
