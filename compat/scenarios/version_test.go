package scenarios

import "testing"

func TestVersionRules(t *testing.T) {
	for _, c := range []struct {
		v                   string
		ahead, lost, synced bool
		refusalIDIsMinusOne bool
	}{
		{"3.4.0", true, false, false, false},
		{"3.4.22", true, false, false, true},
		{"3.4.23", true, false, false, true},
		{"3.4.24", true, false, false, true},
		{"3.4.25", false, true, false, true},
		{"3.4.30", false, true, false, true},
		{"3.4.31", false, false, true, true},
		{"3.5.0", true, false, false, false},
		{"3.5.6", true, false, false, true},
		{"3.5.7", true, false, false, true},
		{"3.5.8", false, true, false, true},
		{"3.5.12", false, true, false, true},
		{"3.5.13", false, false, true, true},
		{"3.5.35", false, false, true, true},
		{"3.6.0", false, false, true, true},
		{"3.6.16", false, false, true, true},
		{"3.7.3-rc.0", false, false, true, true},
	} {
		v, err := ParseVersion(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.ProgressRunsAhead(); got != c.ahead {
			t.Errorf("%s: ProgressRunsAhead %v", c.v, got)
		}
		if got := v.ProgressMayBeLost(); got != c.lost {
			t.Errorf("%s: ProgressMayBeLost %v", c.v, got)
		}
		if got := v.ProgressOnlyWhenSynced(); got != c.synced {
			t.Errorf("%s: ProgressOnlyWhenSynced %v", c.v, got)
		}
		if got := v.RefusalIDIsMinusOne(); got != c.refusalIDIsMinusOne {
			t.Errorf("%s: RefusalIDIsMinusOne %v", c.v, got)
		}
	}
	if _, err := ParseVersion("not a version"); err == nil {
		t.Error("a bad version was parsed")
	}
}
