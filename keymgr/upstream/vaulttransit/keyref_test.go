package vaulttransit

import "testing"

// TestParseKeyRef: a root's Ref.Key is "<name>:<version>", a version of
// one or more and a name Transit could have made.
func TestParseKeyRef(t *testing.T) {
	tests := []struct {
		in   string
		want keyRef
		ok   bool
	}{
		{"meshca-root-20261206t193600z-abcdef:1", keyRef{"meshca-root-20261206t193600z-abcdef", 1}, true},
		{"org-root:12", keyRef{"org-root", 12}, true},
		{"org-root", keyRef{}, false},
		{"org-root:", keyRef{}, false},
		{"org-root:0", keyRef{}, false},
		{"org-root:-1", keyRef{}, false},
		{"org-root:latest", keyRef{}, false},
		{":1", keyRef{}, false},
		{"../sys/policy:1", keyRef{}, false},
		{"a:b:1", keyRef{}, false},
	}
	for _, tt := range tests {
		got, err := parseKeyRef(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseKeyRef(%q) = %+v, %v; want %+v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
		if tt.ok && got.String() != tt.in {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), tt.in)
		}
	}
}
