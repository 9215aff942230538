package etcdwatchprom_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/etcdwatch/etcdwatch/etcdwatchtest"
)

// TestMain fails the package if a goroutine outlives its tests, other than
// the idle peer connections of stopped etcd members that LeakOptions
// ignores.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdwatchtest.LeakOptions()...)
}
