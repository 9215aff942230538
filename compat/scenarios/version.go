package scenarios

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// Version is an etcd server's release, as its Maintenance Status RPC
// reports it.
type Version struct{ Major, Minor, Patch int }

// String returns "3.5.35".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// ParseVersion reads "3.5.35" (a suffix such as "-rc.0" is ignored).
func ParseVersion(s string) (Version, error) {
	var v Version
	if _, err := fmt.Sscanf(s, "%d.%d.%d", &v.Major, &v.Minor, &v.Patch); err != nil {
		return Version{}, fmt.Errorf("scenarios: etcd version %q: %w", s, err)
	}
	return v, nil
}

// ServerVersion asks the member behind conn for its version.
func ServerVersion(ctx context.Context, conn grpc.ClientConnInterface) (Version, error) {
	resp, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return Version{}, err
	}
	return ParseVersion(resp.Version)
}

// within reports whether v is in [lo, hi] of its own minor line.
func (v Version) within(minor, lo, hi int) bool {
	return v.Major == 3 && v.Minor == minor && v.Patch >= lo && v.Patch <= hi
}

// ProgressRunsAhead reports etcd #15220: a progress request is answered at
// once with the store's revision, possibly before events at or below it
// that the stream has not sent yet (3.4.0-3.4.24, 3.5.0-3.5.7).
func (v Version) ProgressRunsAhead() bool { return v.within(4, 0, 24) || v.within(5, 0, 7) }

// ProgressMayBeLost reports etcd #17507: the fix for #15220 defers the
// answer until the watches are synced, and can lose it (3.4.25-3.4.30,
// 3.5.8-3.5.12). A client that asks again is not hurt.
func (v Version) ProgressMayBeLost() bool { return v.within(4, 25, 30) || v.within(5, 8, 12) }

// ProgressOnlyWhenSynced reports the current rule: a progress request is
// answered only while every watch on the stream is synced, otherwise not
// at all (3.4.31+, 3.5.13+, 3.6+).
func (v Version) ProgressOnlyWhenSynced() bool {
	switch {
	case v.Major != 3:
		return v.Major > 3
	case v.Minor == 4:
		return v.Patch >= 31
	case v.Minor == 5:
		return v.Patch >= 13
	default:
		return v.Minor > 5
	}
}

// RefusalIDIsMinusOne reports whether a refused create is answered with
// watch id -1 (PR #14296: 3.4.22+, 3.5.6+); earlier servers echo the
// requested id.
func (v Version) RefusalIDIsMinusOne() bool {
	switch {
	case v.Major != 3:
		return v.Major > 3
	case v.Minor == 4:
		return v.Patch >= 22
	case v.Minor == 5:
		return v.Patch >= 6
	default:
		return v.Minor > 5
	}
}
