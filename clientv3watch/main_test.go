package clientv3watch_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestMain fails the package if a goroutine outlives its tests: a pump,
// a progress requester, a Stream, or clientv3's own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdwatchtest.LeakOptions()...)
}
