package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionReadBuild(t *testing.T) {
	vcs := []debug.BuildSetting{
		{Key: "-trimpath", Value: "true"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "1861281f0c1e5a9b2d7e4c3a6b8f0e1d2c3b4a59"},
		{Key: "vcs.time", Value: "2026-12-04T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	info := func(main string, settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{Main: debug.Module{Path: "github.com/meshca/meshca", Version: main}, Settings: settings}, true
		}
	}
	for _, tt := range []struct {
		name, stamped string
		read          func() (*debug.BuildInfo, bool)
		want          string
	}{
		{"stamped by make build", "v0.1.0-3-g1861281-dirty", info("(devel)", vcs...),
			"v0.1.0-3-g1861281-dirty (revision 1861281f0c1e5a9b2d7e4c3a6b8f0e1d2c3b4a59, 2026-12-04T10:00:00Z, modified)"},
		{"stamped by the image (-buildvcs=false)", "v0.1.0", info("(devel)"), "v0.1.0 (revision unknown)"},
		{"go build in a checkout", "", info("v0.0.0-20261204100000-1861281f0c1e+dirty", vcs...),
			"v0.0.0-20261204100000-1861281f0c1e+dirty (revision 1861281f0c1e5a9b2d7e4c3a6b8f0e1d2c3b4a59, 2026-12-04T10:00:00Z, modified)"},
		{"go build in a clean checkout", "", info("v0.1.0", vcs[:4]...),
			"v0.1.0 (revision 1861281f0c1e5a9b2d7e4c3a6b8f0e1d2c3b4a59, 2026-12-04T10:00:00Z)"},
		{"go install @v0.1.0", "", info("v0.1.0"), "v0.1.0 (revision unknown)"},
		{"nothing recorded", "", info(""), "(devel) (revision unknown)"},
		{"no build info", "", func() (*debug.BuildInfo, bool) { return nil, false }, "(devel) (revision unknown)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := readBuild(tt.stamped, tt.read).String(); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// TestVersionOfPlainBuild: `go build ./cmd/meshca` in a checkout, without
// -X main.version, prints the module version the go command derived and
// the checkout's revision.
func TestVersionOfPlainBuild(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds meshca")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	// -buildvcs=true is go build's default; said here because a
	// machine's go env may turn it off (GOFLAGS=-buildvcs=false).
	bin := filepath.Join(t.TempDir(), "meshca")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("meshca version: %v\n%s", err, out)
	}
	want := regexp.MustCompile(`^meshca v\S+ \(revision ` + strings.TrimSpace(string(head)) + `, [0-9TZ:-]+(, modified)?\) go\S+ \S+/\S+\n$`)
	if !want.Match(out) {
		t.Errorf("meshca version printed %q, want it to match %s", out, want)
	}
}
