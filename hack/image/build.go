package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

// meta is what the image says about itself, resolved from the options and git.
type meta struct {
	Root     string // absolute repository root
	Version  string
	Revision string // empty when unknown: the label is left out
	Source   string
	Created  time.Time // UTC, whole seconds
	Arch     string
	Ref      name.Tag // Repository:Version, the version made a valid tag
	Variant  variant
}

// versionChars are the characters a version may have: git describe's, and
// semver's build metadata, nothing that needs quoting in -ldflags.
var versionChars = regexp.MustCompile(`^[A-Za-z0-9_.+-]+$`)

// resolve fills what o leaves empty from git in o.Root and checks the rest.
func resolve(ctx context.Context, o options) (meta, error) {
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return meta{}, err
	}
	m := meta{Root: root, Version: o.Version, Revision: o.Revision, Source: o.Source, Arch: o.Arch}
	var ok bool
	if m.Variant, ok = variants[o.Variant]; !ok {
		return meta{}, fmt.Errorf("variant %q: want \"\" (the default image) or hsm", o.Variant)
	}
	if m.Version == "" {
		if m.Version, err = git(ctx, root, "describe", "--tags", "--always", "--dirty"); err != nil {
			m.Version = "dev"
		}
	}
	if !versionChars.MatchString(m.Version) {
		return meta{}, fmt.Errorf("version %q: only letters, digits and _.+- are allowed", m.Version)
	}
	if m.Revision == "" {
		m.Revision, _ = git(ctx, root, "rev-parse", "HEAD") // outside a clone: no revision label
	}
	epoch := o.Epoch
	if epoch == "" {
		if epoch, err = git(ctx, root, "log", "-1", "--format=%ct"); err != nil {
			return meta{}, fmt.Errorf("no SOURCE_DATE_EPOCH and no commit time from git: %w", err)
		}
	}
	if m.Created, err = parseEpoch(epoch); err != nil {
		return meta{}, err
	}
	if m.Arch == "" {
		return meta{}, fmt.Errorf("no GOARCH given")
	}
	if m.Variant.Cgo && m.Arch != runtime.GOARCH {
		return meta{}, fmt.Errorf("the %s variant links to this machine's libc: build it on a %s machine, not %s", m.Variant.Name, m.Arch, runtime.GOARCH)
	}
	if m.Variant.Cgo {
		if m.Variant.Libc6, err = dpkgVersion(ctx, "libc6"); err != nil {
			return meta{}, err
		}
	}
	if m.Ref, err = name.NewTag(o.Repository+":"+tagOf(m.Version), name.StrictValidation); err != nil {
		return meta{}, fmt.Errorf("image name: %w", err)
	}
	return m, nil
}

// parseEpoch reads SOURCE_DATE_EPOCH: whole seconds since 1970, not negative.
func parseEpoch(s string) (time.Time, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want whole seconds since 1970", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// tagOf makes version a valid image tag: '+' (semver build metadata)
// becomes '-', and it is cut to the 128 characters a tag may have.
func tagOf(version string) string {
	t := strings.ReplaceAll(version, "+", "-")
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// ldflags are the linker flags of the image's binary: the version stamped
// as make build does, symbol tables and DWARF left out (stack traces keep
// their file:line, from the pcln table).
func ldflags(version string) string {
	return "-s -w -X main.version=" + version
}

// buildBinary builds ./cmd/meshca of m.Root into out, without the paths
// of this machine: -trimpath, no VCS stamp (the revision is the image's
// label). The default variant is static: CGO_ENABLED=0 for GOOS=linux.
// The hsm variant builds with cgo and its build tags (the pkcs11
// upstream), linked to this machine's libc.
func buildBinary(ctx context.Context, m meta, out string) error {
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags(m.Version)}
	if m.Variant.Tags != "" {
		args = append(args, "-tags", m.Variant.Tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "-o", out, "./cmd/meshca")...)
	cmd.Dir = m.Root
	cgo := "CGO_ENABLED=0"
	if m.Variant.Cgo {
		cgo = "CGO_ENABLED=1"
	}
	cmd.Env = append(os.Environ(), cgo, "GOOS=linux", "GOARCH="+m.Arch)
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/meshca: %w\n%s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// git runs git in dir and returns its output's one line.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
