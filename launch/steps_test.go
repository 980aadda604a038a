package launch

import "testing"

// TestStepsOrder checks the order Launch's steps state: each needs only
// what a step before it made, each thing is made once, and all that is
// made is needed, but the last step's.
func TestStepsOrder(t *testing.T) {
	madeBy := map[product]string{}
	needed := map[product]bool{}
	names := map[string]bool{}
	for _, s := range steps {
		if names[s.name] {
			t.Errorf("two steps called %q", s.name)
		}
		names[s.name] = true
		if s.do == nil || len(s.makes) == 0 {
			t.Errorf("step %q does nothing or makes nothing", s.name)
		}
		for _, p := range s.needs {
			if _, ok := madeBy[p]; !ok {
				t.Errorf("step %q needs %q, which no step before it makes", s.name, p)
			}
			needed[p] = true
		}
		for _, p := range s.makes {
			if by, ok := madeBy[p]; ok {
				t.Errorf("step %q makes %q, which %q made already", s.name, p, by)
			}
			madeBy[p] = s.name
		}
	}
	last := steps[len(steps)-1]
	for p, by := range madeBy {
		if !needed[p] && by != last.name && p != podClaimed {
			t.Errorf("%q, which step %q makes, is needed by no step", p, by)
		}
	}
}
