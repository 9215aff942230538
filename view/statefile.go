package view

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"
)

// The saved form of a view's state, as Save writes it and WithRestore and
// WithStateFile read it. Integers are little-endian; varints are
// encoding/binary's (uvarint for lengths, zig-zag varint for the revisions,
// version and lease). Version 1:
//
//	magic     15 bytes  "etcdwatch/view\n"
//	version   uint32    1
//	hlen      uint32    length of the header
//	header    hlen bytes:
//	            cluster   uint64  the cluster ID of the server the state came from
//	            revision  int64   the revision whose state it is
//	            count     uint64  entries that follow
//	            key, end  uvarint length, bytes: the range (etcdwatch.Request's Key and End)
//	hcrc      uint32    CRC-32C (Castagnoli) of magic through header
//	entries   count times, in ascending key order:
//	            klen, vlen   uvarint each: the lengths of key and value
//	            key, value   bytes; the value as the server sent it
//	            create, mod, version, lease  varint each
//	bcrc      uint32    CRC-32C of the entries, starting from hcrc
//
// and nothing after. Every version keeps magic, version, hlen, header and
// hcrc as they are, so that a reader tells another version (its header's
// CRC holds) from a corrupted one (it does not).
const (
	stateMagic   = "etcdwatch/view\n"
	stateVersion = 1
	// maxHeader bounds the header a reader accepts: two keys and 24 bytes.
	maxHeader = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Why a saved state was refused; a *RestoreError wraps one of them (or the
// error reading the state), and the view started with a listing instead.
var (
	// ErrSavedCorrupt: the saved state is truncated, corrupted (a checksum
	// does not match), or not a saved state at all.
	ErrSavedCorrupt = errors.New("etcdwatch/view: saved state truncated or corrupted")
	// ErrSavedVersion: the saved state is of a format version this release
	// does not read.
	ErrSavedVersion = errors.New("etcdwatch/view: saved state of another format version")
	// ErrSavedRange: the saved state is of another range than the view's.
	ErrSavedRange = errors.New("etcdwatch/view: saved state of another range")
	// ErrSavedCluster: the saved state came from another cluster (its ID
	// differs from the one the Source reaches).
	ErrSavedCluster = errors.New("etcdwatch/view: saved state of another cluster")
	// ErrSavedAhead: the saved state's revision is above the cluster's
	// current one, as after the cluster was restored from a backup: its
	// history since that revision is not the one the state saw.
	ErrSavedAhead = errors.New("etcdwatch/view: saved state ahead of the cluster")
)

// RestoreError is why a view did not start from the saved state it was
// given (WithRestore, WithStateFile), from View.Restored; the view listed
// its range instead. Err wraps the cause: one of ErrSavedCorrupt,
// ErrSavedVersion, ErrSavedRange, ErrSavedCluster and ErrSavedAhead for
// errors.Is; the error reading the state; or the server's, when a call the
// start from it needs failed for a reason that may pass (whether its
// history since is compacted, its watch, the listing against it): the
// retry lists, and the saved state is not tried again.
type RestoreError struct {
	Path string // WithStateFile's file; "" for WithRestore
	Err  error
}

func (e *RestoreError) Error() string {
	if e.Path == "" {
		return "etcdwatch/view: saved state not restored: " + e.Err.Error()
	}
	return fmt.Sprintf("etcdwatch/view: saved state %s not restored: %v", e.Path, e.Err)
}

func (e *RestoreError) Unwrap() error { return e.Err }

// corrupt is ErrSavedCorrupt, with what was wrong.
func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSavedCorrupt, fmt.Sprintf(format, args...))
}

// stateHeader is what a saved state says of itself.
type stateHeader struct {
	cluster  uint64
	revision int64
	count    uint64
	key, end []byte
}

// savedEntry is one key of a saved state: its value as the server sent it,
// and the revisions of its KeyValue. A reader gives the key as bytes too:
// kv holds the key's bytes, then the value's, a buffer of the entry's own.
type savedEntry struct {
	key                         string
	value, kv                   []byte
	create, mod, version, lease int64
}

// inRange reports whether key belongs to the range key..end, as etcd reads
// a range: one key when end is empty, every key from key on when end is
// "\x00", else key <= k < end.
func inRange(key, end []byte, k string) bool {
	switch {
	case len(end) == 0:
		return k == string(key)
	case len(end) == 1 && end[0] == 0:
		return k >= string(key)
	}
	return k >= string(key) && k < string(end)
}

// flushAt is how much a stateWriter buffers before it writes.
const flushAt = 64 << 10

// stateWriter writes a saved state, summing what it writes.
type stateWriter struct {
	w   io.Writer
	buf []byte
	crc uint32
	err error
}

// writeState writes h and then count entries, which each yields in
// ascending key order; the entries must be what h says (its count).
func writeState(w io.Writer, h stateHeader, each func(yield func(*savedEntry) bool)) error {
	sw := &stateWriter{w: w, buf: make([]byte, 0, flushAt+1024)}
	sw.buf = append(sw.buf, stateMagic...)
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, stateVersion)
	at := len(sw.buf)
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, 0) // hlen, set below
	sw.buf = binary.LittleEndian.AppendUint64(sw.buf, h.cluster)
	sw.buf = binary.LittleEndian.AppendUint64(sw.buf, uint64(h.revision))
	sw.buf = binary.LittleEndian.AppendUint64(sw.buf, h.count)
	sw.buf = appendBytes(sw.buf, h.key)
	sw.buf = appendBytes(sw.buf, h.end)
	binary.LittleEndian.PutUint32(sw.buf[at:], uint32(len(sw.buf)-at-4))
	sw.crc = crc32.Checksum(sw.buf, castagnoli)
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, sw.crc)
	if sw.flush(); sw.err != nil {
		return sw.err
	}
	n := uint64(0)
	for e := range each {
		n++
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(e.key)))
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(e.value)))
		sw.buf = append(sw.buf, e.key...)
		if len(e.value) > flushAt { // written as it is, not copied
			sw.summed(e.value)
		} else {
			sw.buf = append(sw.buf, e.value...)
		}
		sw.buf = binary.AppendVarint(sw.buf, e.create)
		sw.buf = binary.AppendVarint(sw.buf, e.mod)
		sw.buf = binary.AppendVarint(sw.buf, e.version)
		sw.buf = binary.AppendVarint(sw.buf, e.lease)
		if len(sw.buf) >= flushAt {
			if sw.sum(); sw.err != nil {
				return sw.err
			}
		}
	}
	if n != h.count {
		return fmt.Errorf("etcdwatch/view: saving: %d entries, the header says %d", n, h.count)
	}
	sw.sum()
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, sw.crc)
	sw.flush()
	return sw.err
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// sum adds the buffer to the checksum and writes it.
func (sw *stateWriter) sum() {
	sw.crc = crc32.Update(sw.crc, castagnoli, sw.buf)
	sw.flush()
}

// summed writes the buffer, then p, adding both to the checksum.
func (sw *stateWriter) summed(p []byte) {
	if sw.sum(); sw.err == nil {
		sw.crc = crc32.Update(sw.crc, castagnoli, p)
		_, sw.err = sw.w.Write(p)
	}
}

// flush writes the buffer as it is.
func (sw *stateWriter) flush() {
	if sw.err == nil && len(sw.buf) > 0 {
		_, sw.err = sw.w.Write(sw.buf)
	}
	sw.buf = sw.buf[:0]
}

// stateReader reads a saved state from an io.Reader through a buffer of
// its own, summing what it consumes: the caller sees the header (readHeader)
// before it decides to read the entries (readEntries), and no more of the
// input is read than the state holds, besides the buffer's read-ahead.
type stateReader struct {
	r   io.Reader
	buf []byte // buf[pos:] is read and not yet consumed
	pos int
	sum int // buf[sum:pos] is consumed and not yet added to crc
	crc uint32
	err error // the reader's error, io.EOF at the end; no more reads once set
}

// readBuffer is the read-ahead of a stateReader.
const readBuffer = 256 << 10

// readHeader reads and checks a saved state's header: its format, version,
// checksum and self-consistency. The range, cluster and revision are the
// caller's to check.
func readHeader(r io.Reader) (*stateReader, stateHeader, error) {
	sr := &stateReader{r: r, buf: make([]byte, 0, readBuffer)}
	var h stateHeader
	const fixed = len(stateMagic) + 8
	if !sr.fill(fixed) {
		return nil, h, sr.short("the header")
	}
	b := sr.buf[sr.pos:]
	if string(b[:len(stateMagic)]) != stateMagic {
		return nil, h, corrupt("not a saved view state (magic %q)", b[:len(stateMagic)])
	}
	version := binary.LittleEndian.Uint32(b[len(stateMagic):])
	hlen := binary.LittleEndian.Uint32(b[len(stateMagic)+4:])
	if hlen > maxHeader {
		return nil, h, corrupt("header of %d bytes", hlen)
	}
	if !sr.fill(fixed + int(hlen) + 4) {
		return nil, h, sr.short("the header")
	}
	b = sr.buf[sr.pos : sr.pos+fixed+int(hlen)]
	want := binary.LittleEndian.Uint32(sr.buf[sr.pos+len(b):])
	if got := crc32.Checksum(b, castagnoli); got != want {
		return nil, h, corrupt("header checksum %08x, saved %08x", got, want)
	}
	if version != stateVersion {
		return nil, h, fmt.Errorf("%w: version %d; this release reads version %d", ErrSavedVersion, version, stateVersion)
	}
	sr.crc = want
	sr.pos += len(b) + 4
	sr.sum = sr.pos
	hb := b[fixed:]
	if len(hb) < 24 {
		return nil, h, corrupt("header of %d bytes", len(hb))
	}
	h.cluster = binary.LittleEndian.Uint64(hb)
	h.revision = int64(binary.LittleEndian.Uint64(hb[8:]))
	h.count = binary.LittleEndian.Uint64(hb[16:])
	hb = hb[24:]
	var ok bool
	if h.key, hb, ok = cutBytes(hb); !ok {
		return nil, h, corrupt("header's key")
	}
	if h.end, hb, ok = cutBytes(hb); !ok || len(hb) != 0 {
		return nil, h, corrupt("header's range end")
	}
	if h.revision < 1 {
		return nil, h, corrupt("revision %d", h.revision)
	}
	return sr, h, nil
}

// cutBytes takes a uvarint length and that many bytes, copied, off b.
func cutBytes(b []byte) (s, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || (k > 1 && b[k-1] == 0) || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	return bytes.Clone(b[k : k+int(n)]), b[k+int(n):], true
}

// errStopped is readEntries' error when its fn asked it to stop.
var errStopped = errors.New("etcdwatch/view: reading the saved state stopped")

// readEntries reads the entries after h, checks each (in the range, in
// ascending key order, revisions no later than h's) and the checksum, and
// requires the input to end there. fn sees every entry before the checksum
// is known: nothing it builds of them may be used until readEntries returns
// nil. It returns errStopped once fn returns false.
//
// Each entry's kv is a buffer of its own; or, with lend, the reader's own
// buffer, valid only until fn returns, for a caller that copies the few it
// keeps (its key is a string of its own either way).
func (sr *stateReader) readEntries(h stateHeader, lend bool, fn func(savedEntry) bool) error {
	last := ""
	for i := uint64(0); i < h.count; i++ {
		e, err := sr.entry(lend)
		if err != nil {
			return err
		}
		switch {
		case i > 0 && e.key <= last:
			return corrupt("key %q after %q", e.key, last)
		case !inRange(h.key, h.end, e.key):
			return corrupt("key %q outside the range", e.key)
		case e.mod > h.revision || e.create < 1 || e.create > e.mod || e.version < 1:
			return corrupt("key %q: create %d, mod %d, version %d, lease %d at revision %d", e.key, e.create, e.mod, e.version, e.lease, h.revision)
		}
		last = e.key
		if !fn(e) {
			return errStopped
		}
	}
	if !sr.fill(4) {
		return sr.short("the checksum")
	}
	sr.consumed()
	want := binary.LittleEndian.Uint32(sr.buf[sr.pos:])
	if sr.crc != want {
		return corrupt("checksum %08x, saved %08x", sr.crc, want)
	}
	sr.pos += 4
	sr.sum = sr.pos
	if sr.fill(1) {
		return corrupt("data after the end")
	}
	if sr.err != io.EOF {
		return sr.err
	}
	return nil
}

// entry reads one entry, its key and value in one buffer: of its own, or
// lent (see readEntries).
func (sr *stateReader) entry(lend bool) (savedEntry, error) {
	var e savedEntry
	klen, err := sr.uvarint("a key's length")
	if err != nil {
		return e, err
	}
	vlen, err := sr.uvarint("a value's length")
	if err != nil {
		return e, err
	}
	if klen > maxHeader || vlen > math.MaxInt-klen {
		return e, corrupt("a key of %d bytes and a value of %d", klen, vlen)
	}
	var kv []byte
	if n := int(klen + vlen); lend {
		// The revisions after kv are read into the buffer now, with kv: a
		// refill while reading them would move kv. The buffer grows with
		// what comes, as for a large header.
		if sr.fill(n + 4*binary.MaxVarintLen64); len(sr.buf)-sr.pos < n {
			return e, sr.short("an entry")
		}
		kv = sr.buf[sr.pos : sr.pos+n]
		sr.pos += n
	} else {
		// Sized as the entry says, up to the read-ahead: a length beyond what
		// the input holds fails at its end, having allocated about what it held.
		kv = make([]byte, 0, min(n, readBuffer))
		if kv, err = sr.appendN(kv, uint64(n)); err != nil {
			return e, err
		}
	}
	e.kv = kv[:len(kv):len(kv)]
	e.key, e.value = string(kv[:klen]), e.kv[klen:]
	for _, p := range []*int64{&e.create, &e.mod, &e.version, &e.lease} {
		if *p, err = sr.varint(); err != nil {
			return e, err
		}
	}
	return e, nil
}

// fill reads until n bytes are unconsumed, or the input ends (false).
func (sr *stateReader) fill(n int) bool {
	for len(sr.buf)-sr.pos < n && sr.err == nil {
		if sr.pos > 0 && cap(sr.buf)-len(sr.buf) < readBuffer/2 {
			sr.consumed()
			sr.buf = sr.buf[:copy(sr.buf, sr.buf[sr.pos:])]
			sr.pos, sr.sum = 0, 0
		}
		if len(sr.buf) == cap(sr.buf) { // n is above the buffer (a large header): grow with what comes
			sr.buf = slices.Grow(sr.buf, len(sr.buf))
		}
		k, err := sr.r.Read(sr.buf[len(sr.buf):cap(sr.buf)])
		sr.buf = sr.buf[:len(sr.buf)+k]
		if err != nil {
			sr.err = err
		}
	}
	return len(sr.buf)-sr.pos >= n
}

// consumed adds what was consumed to the checksum.
func (sr *stateReader) consumed() {
	sr.crc = crc32.Update(sr.crc, castagnoli, sr.buf[sr.sum:sr.pos])
	sr.sum = sr.pos
}

// appendN appends the next n bytes to b. A length beyond what the input
// holds fails at its end, having allocated about what it held.
func (sr *stateReader) appendN(b []byte, n uint64) ([]byte, error) {
	for n > 0 {
		if !sr.fill(1) {
			return nil, sr.short("a value")
		}
		k := min(n, uint64(len(sr.buf)-sr.pos))
		b = append(b, sr.buf[sr.pos:sr.pos+int(k)]...)
		sr.pos += int(k)
		n -= k
	}
	return b, nil
}

func (sr *stateReader) uvarint(what string) (uint64, error) {
	sr.fill(binary.MaxVarintLen64)
	v, k := binary.Uvarint(sr.buf[sr.pos:])
	if k <= 0 || (k > 1 && sr.buf[sr.pos+k-1] == 0) { // overflowing, short, or not the shortest form
		return 0, sr.shortOr(k != 0, what)
	}
	sr.pos += k
	return v, nil
}

func (sr *stateReader) varint() (int64, error) {
	u, err := sr.uvarint("a revision")
	return int64(u>>1) ^ -int64(u&1), err // zig-zag, as binary.Varint
}

// short is the error of an input that ended before what, or failed.
func (sr *stateReader) short(what string) error {
	if sr.err == nil || sr.err == io.EOF || sr.err == io.ErrUnexpectedEOF {
		return corrupt("truncated: the input ends before %s", what)
	}
	return sr.err // reading failed: not the state's fault
}

// shortOr is short, or when bad, the error of a malformed what.
func (sr *stateReader) shortOr(bad bool, what string) error {
	if bad {
		return corrupt("malformed %s", what)
	}
	return sr.short(what)
}
