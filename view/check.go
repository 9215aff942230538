package view

import (
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkLoop compares the view with the server every integrity interval,
// until the state ends.
func (c *core[T]) checkLoop() {
	t := time.NewTicker(c.opts.integrity)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			c.checkOnce()
		}
	}
}

// maxReported bounds the differing keys one check logs.
const maxReported = 8

// checkOnce compares the published state with a listing of the range at
// its revision, keys and revisions only: a key's ModRevision names its
// value. A mismatch asks the runner to list again.
func (c *core[T]) checkOnce() {
	s := c.snap.Load()
	diff, err := c.compare(s)
	switch {
	case status.Code(err) == codes.OutOfRange: // the state's revision is compacted: a bookmark moves it
		c.log.Debug("etcdwatch: view check skipped; its revision is compacted", "revision", s.rev)
		c.askProgress()
		return
	case err != nil:
		c.log.Debug("etcdwatch: view check failed", "revision", s.rev, "err", err)
		return
	}
	if c.snap.Load().listing != s.listing { // listed again meanwhile: what s lacked is repaired
		c.log.Debug("etcdwatch: view check outdated by a listing", "revision", s.rev)
		return
	}
	c.stats.checks.Add(1)
	if len(diff) == 0 {
		return
	}
	c.stats.mismatches.Add(1)
	c.log.Error("etcdwatch: view differs from the server; listing again", "revision", s.rev, "keys", diff)
	select {
	case c.repair <- s.listing: // the runner lists again unless it has since s
	default:
	}
}

// compare lists the range at s's revision and returns the keys (up to
// maxReported) whose presence or revisions differ from s.
func (c *core[T]) compare(s *Snapshot[T]) ([]string, error) {
	var cmp comparison[T]
	walk := newMerge(s.m.All(), &cmp)
	defer walk.stop()
	if _, err := c.reads.list(c.ctx, listing{rev: s.rev, keysOnly: true}, walk.take); err != nil {
		return nil, err
	}
	walk.finish()
	return cmp.diff, nil
}

// comparison is the outcomes of an integrity check's merge: the keys that
// differ, up to maxReported.
type comparison[T any] struct{ diff []string }

func (c *comparison[T]) report(key string) {
	if len(c.diff) < maxReported {
		c.diff = append(c.diff, key)
	}
}

func (c *comparison[T]) stateOnly(key string, _ Entry[T]) { c.report(key) }
func (c *comparison[T]) listedOnly(kv *mvccpb.KeyValue)   { c.report(string(kv.Key)) }

func (c *comparison[T]) both(e Entry[T], kv *mvccpb.KeyValue) {
	if !sameRecord(e, kv) {
		c.report(e.Key)
	}
}
