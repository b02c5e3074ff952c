// Package release holds the checks that tie a release's parts together:
// the chart's appVersion is the newest version CHANGELOG.md describes.
package release

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var (
	// A version's heading, in Keep a Changelog's form: "## [0.1.0] -
	// 2026-12-05", or "- Unreleased" until it is tagged.
	versionHeading = regexp.MustCompile(`^## \[(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)\] - (\d{4}-\d{2}-\d{2}|Unreleased)$`)
	heading        = regexp.MustCompile(`(?m)^## .*$`)
	appVersion     = regexp.MustCompile(`(?m)^appVersion: "?([^"\s]+)"?\s*$`)
)

// newestVersion is the version of a changelog's first heading, or of the
// second when the first is "## [Unreleased]" (changes not yet in a
// version), and whether the changelog links it.
func newestVersion(changelog []byte) (string, error) {
	hs := heading.FindAll(changelog, 2)
	if len(hs) > 0 && string(hs[0]) == "## [Unreleased]" {
		hs = hs[1:]
	}
	if len(hs) == 0 {
		return "", errors.New(`no version heading`)
	}
	m := versionHeading.FindSubmatch(hs[0])
	if m == nil {
		return "", errors.New(`the newest heading, "` + string(hs[0]) + `", is not "## [X.Y.Z] - YYYY-MM-DD" (or "- Unreleased")`)
	}
	v := string(m[1])
	if !regexp.MustCompile(`(?m)^\[` + regexp.QuoteMeta(v) + `\]: https://\S+$`).Match(changelog) {
		return "", errors.New("no link for [" + v + "]")
	}
	return v, nil
}

func TestNewestVersion(t *testing.T) {
	for _, tt := range []struct{ changelog, want string }{
		{"# Changelog\n\n## [0.1.0] - Unreleased\n\n- a\n\n[0.1.0]: https://x/v0.1.0\n", "0.1.0"},
		{"## [Unreleased]\n\n- b\n\n## [0.2.0] - 2027-01-02\n\n## [0.1.0] - 2026-12-05\n\n[0.2.0]: https://x/v0.2.0\n", "0.2.0"},
		{"## [Unreleased]\n\n- b\n", ""},
		{"## [0.2.0]\n\n[0.2.0]: https://x/v0.2.0\n", ""},
		{"## [0.2.0] - 2027-01-02\n", ""},
		{"# Changelog\n", ""},
	} {
		got, err := newestVersion([]byte(tt.changelog))
		if got != tt.want || (err == nil) != (tt.want != "") {
			t.Errorf("newestVersion(%q) = %q, %v; want %q", tt.changelog, got, err, tt.want)
		}
	}
}

func TestChartAppVersionIsNewestChangelogVersion(t *testing.T) {
	v, err := newestVersion(read(t, "CHANGELOG.md"))
	if err != nil {
		t.Fatalf("CHANGELOG.md: %v", err)
	}
	a := appVersion.FindSubmatch(read(t, "deploy/charts/meshca/Chart.yaml"))
	if a == nil {
		t.Fatal("deploy/charts/meshca/Chart.yaml has no appVersion")
	}
	if string(a[1]) != "v"+v {
		t.Errorf("deploy/charts/meshca/Chart.yaml: appVersion %s, want v%s: the newest version of CHANGELOG.md", a[1], v)
	}
}

// read returns a file of the repository, two folders up.
func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
