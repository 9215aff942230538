package view

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
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

// TestStateOfAFromKeyRange: a state of a range from a key on (End
// "\x00", etcdwatch.FromKey) holds that key itself when it exists, and
// reads back. Catches: the reader taking the range's start as exclusive,
// which refuses every such state holding its start key (the view then
// lists at each restart).
func TestStateOfAFromKeyRange(t *testing.T) {
	h := stateHeader{cluster: 1, revision: 9, key: []byte("p/"), end: []byte{0}}
	es := []savedEntry{
		{key: "p/", value: []byte("start"), create: 2, mod: 2, version: 1},
		{key: "p/a", value: []byte("a"), create: 3, mod: 3, version: 1},
		{key: "z", value: []byte("after"), create: 4, mod: 9, version: 2},
	}
	got, ges, err := decodeState(bytes.NewReader(encodeState(t, h, es)))
	require.NoError(t, err)
	require.Equal(t, []byte{0}, got.end)
	requireSameEntries(t, es, ges)

	h.key = []byte("p/a") // p/ is before the range now
	_, _, err = decodeState(bytes.NewReader(encodeState(t, h, es)))
	require.ErrorIs(t, err, ErrSavedCorrupt)
}

// TestStateOfOneKey: a state of one key's range (End empty) holds
// that key alone; another key, after it, is outside the range, and such a
// state (only a broken writer writes one) is refused. Catches: the reader
// taking a one-key range for a range from the key on.
func TestStateOfOneKey(t *testing.T) {
	h := stateHeader{cluster: 1, revision: 9, key: []byte("k")}
	one := []savedEntry{{key: "k", value: []byte("v"), create: 2, mod: 2, version: 1}}
	_, ges, err := decodeState(bytes.NewReader(encodeState(t, h, one)))
	require.NoError(t, err)
	requireSameEntries(t, one, ges)

	two := append(one, savedEntry{key: "k2", value: []byte("w"), create: 3, mod: 3, version: 1})
	for _, lend := range []bool{false, true} {
		_, _, err = decodeLent(bytes.NewReader(encodeState(t, h, two)), lend)
		require.ErrorIs(t, err, ErrSavedCorrupt, "a key after a one-key range's (lent: %v)", lend)
	}
}

// TestStateRefusesWhatOnlyABrokenWriterWrites: checksums right,
// the first two keys out of order, or a key created at revision 0, are
// refused as TestStateLoaderRefuses's other cases are. Catches: the order
// checked from the third key on, and the creation revision's lower bound
// left out.
func TestStateRefusesWhatOnlyABrokenWriterWrites(t *testing.T) {
	for name, change := range map[string]func(es []savedEntry){
		"first two keys out of order": func(es []savedEntry) { es[0], es[1] = es[1], es[0] },
		"the first two keys the same": func(es []savedEntry) { es[1].key = es[0].key },
		"created at revision 0":       func(es []savedEntry) { es[1].create = 0 },
		"created at a negative one":   func(es []savedEntry) { es[2].create = -5 },
	} {
		h, es := sampleState()
		change(es)
		for _, lend := range []bool{false, true} {
			_, _, err := decodeLent(bytes.NewReader(encodeState(t, h, es)), lend)
			require.ErrorIs(t, err, ErrSavedCorrupt, "%s (lent: %v)", name, lend)
		}
	}
}

// TestStateHeaderIsExactlyVersion1s: a state whose checksums are
// right (resum) but whose magic is another's, or whose header holds a byte
// more than its fields, is refused: it is not what this release writes.
// The header's key length written in two bytes where one does is refused
// too. Catches: the magic not checked (only the header's checksum, which
// the other format's writer makes right), bytes after the header's range
// end taken as nothing, and a non-canonical length in the header.
func TestStateHeaderIsExactlyVersion1s(t *testing.T) {
	h, es := sampleState()
	file := encodeState(t, h, es)
	_, _, err := decodeState(bytes.NewReader(resum(file)))
	require.NoError(t, err, "resum of a good state changes nothing")

	other := bytes.Clone(file)
	copy(other, "etcdwatch/VIEW\n")
	for _, lend := range []bool{false, true} {
		_, _, err = decodeLent(bytes.NewReader(resum(other)), lend)
		require.ErrorIs(t, err, ErrSavedCorrupt, "another magic (lent: %v)", lend)
	}

	const fixed = len(stateMagic) + 8
	hlen := int(binary.LittleEndian.Uint32(file[len(stateMagic)+4:]))
	longer := slicesConcat(file[:fixed+hlen], []byte{0}, file[fixed+hlen:])
	binary.LittleEndian.PutUint32(longer[len(stateMagic)+4:], uint32(hlen+1))
	for _, lend := range []bool{false, true} {
		_, _, err = decodeLent(bytes.NewReader(resum(longer)), lend)
		require.ErrorIs(t, err, ErrSavedCorrupt, "a byte after the header's fields (lent: %v)", lend)
	}

	// The key's length, 2, in two bytes where one does: the same header,
	// another form, which re-encoding would not give back.
	at := fixed + 24
	require.Equal(t, []byte{2, 'p', '/'}, file[at:at+3])
	long := slicesConcat(file[:at], []byte{0x82, 0x00}, file[at+1:])
	binary.LittleEndian.PutUint32(long[len(stateMagic)+4:], uint32(hlen+1))
	for _, lend := range []bool{false, true} {
		_, _, err = decodeLent(bytes.NewReader(resum(long)), lend)
		require.ErrorIs(t, err, ErrSavedCorrupt, "a non-canonical length of the header's key (lent: %v)", lend)
	}
}

// TestStateHeaderTooShort: a header of fewer bytes than its fixed
// fields (24), its checksums right, is refused, not read past its end.
// Catches: a bound below 24, which panics on such a file in New.
func TestStateHeaderTooShort(t *testing.T) {
	for _, n := range []int{0, 8, 16, 20, 23} {
		b := []byte(stateMagic)
		b = binary.LittleEndian.AppendUint32(b, stateVersion)
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
		b = append(b, make([]byte, n+8)...) // the header, its checksum, the entries' checksum
		for _, lend := range []bool{false, true} {
			require.NotPanics(t, func() {
				_, _, err := decodeLent(bytes.NewReader(resum(b)), lend)
				require.ErrorIs(t, err, ErrSavedCorrupt, "a header of %d bytes (lent: %v)", n, lend)
			})
		}
	}
}

// TestLentReadHoldsABufferNotTheState: a saved state read with
// its entries lent (relistSaved's merge) is read through a buffer of its
// own size, not held whole: reading a state of 8 MiB allocates about the
// read-ahead. Catches: the buffer never compacted, which grows it to the
// whole state (relistSaved is then a second copy of the state in memory).
func TestLentReadHoldsABufferNotTheState(t *testing.T) {
	h := stateHeader{cluster: 1, revision: 10, key: []byte("p/"), end: []byte("p0")}
	es := make([]savedEntry, 8<<10)
	value := bytes.Repeat([]byte{'v'}, 1<<10)
	for i := range es {
		es[i] = savedEntry{key: fmt.Sprintf("p/%06d", i), value: value, create: 1, mod: 2, version: 1}
	}
	file := encodeState(t, h, es)
	require.Greater(t, len(file), 8<<20)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	sr, hh, err := readHeader(bytes.NewReader(file))
	require.NoError(t, err)
	n := 0
	require.NoError(t, sr.readEntries(hh, true, func(savedEntry) bool { n++; return true }))
	runtime.ReadMemStats(&after)
	require.Equal(t, len(es), n)
	alloc := after.TotalAlloc - before.TotalAlloc
	require.Less(t, alloc, uint64(2<<20), "reading a state of %d bytes, lent, allocated %d", len(file), alloc)
}
