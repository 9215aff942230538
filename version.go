package etcdwatch

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/etcdwatch/etcdwatch/internal/clock"
	"github.com/etcdwatch/etcdwatch/internal/rpcerr"
)

// serverRelease is an etcd release, as the Maintenance Status RPC reports it.
type serverRelease struct{ major, minor, patch int }

// parseRelease reads "3.5.35"; a suffix such as "-rc.0" is ignored.
func parseRelease(s string) (serverRelease, bool) {
	var r serverRelease
	_, err := fmt.Sscanf(s, "%d.%d.%d", &r.major, &r.minor, &r.patch)
	return r, err == nil
}

// progressRunsAhead reports etcd #15220: the server answers a progress
// request at once with its store's revision, possibly before events at or
// below it that the stream has yet to send (3.4.0-3.4.24, 3.5.0-3.5.7).
// A bookmark at that revision would then make the Stream drop those events
// as duplicates.
func (r serverRelease) progressRunsAhead() bool {
	if r.major != 3 {
		return false
	}
	return r.minor == 4 && r.patch <= 24 || r.minor == 5 && r.patch <= 7
}

// probeAttempts bounds how often probeRelease asks before it gives up.
const probeAttempts = 10

// probeRelease asks the server its release, once it answers, and tells the
// dispatcher. A Stream assumes every member of a cluster runs the same
// release; during a rolling upgrade the member that answers decides. It
// gives up on a server without the RPC or one that refuses it, after
// probeAttempts failures, or when the Stream closes; the release is then
// unknown, and taken to be one without etcd #15220.
func (s *Stream) probeRelease(ctx context.Context) {
	r, ok := s.askRelease(ctx)
	c := versionCmd{r, ok}
	s.mu.Lock()
	s.release = &c // for a lane opened after
	lanes := []*lane{s.main}
	if s.isolated != nil {
		lanes = append(lanes, s.isolated)
	}
	s.mu.Unlock()
	for _, l := range lanes {
		l.command(c)
	}
}

func (s *Stream) askRelease(ctx context.Context) (serverRelease, bool) {
	m := pb.NewMaintenanceClient(s.Conn())
	for attempt := 1; ; attempt++ {
		resp, err := m.Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
		if err == nil {
			r, ok := parseRelease(resp.Version)
			if !ok {
				s.opts.logger.Debug("etcdwatch: server release not understood", "version", resp.Version)
			}
			return r, ok
		}
		if rpcerr.Final(err) || rpcerr.Canceled(err) {
			s.opts.logger.Debug("etcdwatch: server release unknown", "err", err)
			return serverRelease{}, false
		}
		if attempt == probeAttempts || clock.Sleep(ctx, s.opts.clock, time.Duration(attempt)*time.Second) != nil {
			s.opts.logger.Debug("etcdwatch: server release unknown", "err", err, "attempts", attempt)
			return serverRelease{}, false
		}
	}
}

// handleVersion takes the servers' release, and answers the RequestProgress
// calls that waited for it. On a release whose progress answers can run
// ahead of its events, stream-wide progress is not used: RequestProgress
// fails with ErrProgressUnsupported.
func (d *dispatcher) handleVersion(c versionCmd) {
	d.releaseKnown = true
	if c.ok && c.release.progressRunsAhead() {
		d.progressUnsafe = fmt.Errorf("%w: etcd %s answers progress requests ahead of its events (etcd #15220; fixed in 3.4.25 and 3.5.8)",
			ErrProgressUnsupported, c.release)
		d.log.Warn("etcdwatch: this etcd answers progress requests ahead of its events (etcd #15220); RequestProgress is off",
			"version", c.release.String())
	}
	held := d.progress.held
	d.progress.held = nil
	for _, p := range held {
		d.handleProgressRequest(p)
	}
}

// String returns "3.4.23".
func (r serverRelease) String() string { return fmt.Sprintf("%d.%d.%d", r.major, r.minor, r.patch) }
