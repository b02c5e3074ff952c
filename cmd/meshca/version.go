package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/meshca/meshca/keymgr/upstream/pkcs11"
	"github.com/spf13/cobra"
)

// version is meshca's version: set at build time with -ldflags
// "-X main.version=..." (make build and the image stamp `git describe`),
// else, at start, the main module's version as the go command recorded it
// (build.Version). The config audit event carries it.
var version string

// build is what the go command recorded of this binary.
var build = readBuild(version, debug.ReadBuildInfo)

func init() { version = build.Version }

// buildStamp is a binary's version and where in the VCS it was built.
type buildStamp struct {
	// Version is the -X version, else the main module's: v0.1.0 (go
	// install ...@v0.1.0), a version or pseudo-version the go command
	// derived from the VCS (go build in a checkout, +dirty when modified),
	// or (devel) when it knew none.
	Version string
	// Revision, Time and Modified are vcs.revision, vcs.time and
	// vcs.modified; Revision is empty when the build recorded none
	// (-buildvcs=false, or a build outside a checkout).
	Revision, Time string
	Modified       bool
}

// readBuild is the buildStamp of a binary stamped with version (empty:
// not stamped) whose build info read returns.
func readBuild(version string, read func() (*debug.BuildInfo, bool)) buildStamp {
	b := buildStamp{Version: version}
	bi, ok := read()
	if !ok {
		bi = &debug.BuildInfo{}
	}
	if b.Version == "" {
		b.Version = bi.Main.Version
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the version followed by the revision, its time and whether
// the tree had changes: "v0.1.0 (revision 1861281…, 2026-12-04T10:00:00Z,
// modified)"; "(revision unknown)" when none was recorded.
func (b buildStamp) String() string {
	if b.Revision == "" {
		return b.Version + " (revision unknown)"
	}
	about := []string{"revision " + b.Revision}
	if b.Time != "" {
		about = append(about, b.Time)
	}
	if b.Modified {
		about = append(about, "modified")
	}
	return fmt.Sprintf("%s (%s)", b.Version, strings.Join(about, ", "))
}

// features names what this build has beyond the default one: " pkcs11"
// for the HSM variant (make build-hsm), whose pkcs11 upstream needs cgo.
func features() string {
	if pkcs11.Supported {
		return " pkcs11"
	}
	return ""
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the VCS revision it was built from, Go's version and platform, and pkcs11 for the HSM build",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "meshca %s %s %s/%s%s\n", build, runtime.Version(), runtime.GOOS, runtime.GOARCH, features())
			return nil
		},
	}
}
