package etcdwatch

// packed is a Request as a Watch keeps it, in half a Request's space (a
// million watches keep a million): Key and End in one string, the options
// as bits. Immutable; its string is the Watch's own copy.
type packed struct {
	keys     string // Key, then End
	revision int64
	keyLen   int32
	opts     packedOpts
}

// packedOpts are a Request's options, one bit each.
type packedOpts uint8

const (
	optEnd            packedOpts = 1 << iota // End is not nil
	optPrevKV                                // PrevKV
	optNoPut                                 // NoPut
	optNoDelete                              // NoDelete
	optProgressNotify                        // ProgressNotify
	optFragment                              // Fragment
	optIsolated                              // Isolated
)

// pack returns r as a Watch keeps it: a copy, so that a caller who reuses
// r's buffers cannot change a running watch.
func pack(r Request) packed {
	p := packed{keys: string(r.Key) + string(r.End), revision: r.Revision, keyLen: int32(len(r.Key))}
	for _, o := range []struct {
		set bool
		opt packedOpts
	}{{r.End != nil, optEnd}, {r.PrevKV, optPrevKV}, {r.NoPut, optNoPut}, {r.NoDelete, optNoDelete},
		{r.ProgressNotify, optProgressNotify}, {r.Fragment, optFragment}, {r.Isolated, optIsolated}} {
		if o.set {
			p.opts |= o.opt
		}
	}
	return p
}

func (p *packed) has(o packedOpts) bool { return p.opts&o != 0 }

// key and end are the Request's Key and End ("" for a nil End).
func (p *packed) key() string { return p.keys[:p.keyLen] }
func (p *packed) end() string { return p.keys[p.keyLen:] }

// request returns the Request p was packed from, with buffers of its own.
func (p *packed) request() Request {
	r := Request{
		Key: []byte(p.key()), Revision: p.revision,
		PrevKV: p.has(optPrevKV), NoPut: p.has(optNoPut), NoDelete: p.has(optNoDelete),
		ProgressNotify: p.has(optProgressNotify), Fragment: p.has(optFragment), Isolated: p.has(optIsolated),
	}
	if p.has(optEnd) {
		r.End = []byte(p.end())
	}
	return r
}
