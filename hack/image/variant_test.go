package main

import (
	"archive/tar"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// hsmBuilt is the hsm variant's image, built and packed once, and its
// layer extracted into a root filesystem.
var hsmBuilt struct {
	once  sync.Once
	err   error
	meta  meta
	tar   string
	files []entry
	root  string // the layer's files, extracted
}

func hsmFixture(t *testing.T) {
	t.Helper()
	hsmBuilt.once.Do(func() { hsmBuilt.err = buildHSMFixture(context.Background()) })
	if hsmBuilt.err != nil {
		t.Fatal(hsmBuilt.err)
	}
}

func buildHSMFixture(ctx context.Context) error {
	m, err := resolve(ctx, options{Root: "../..", Version: testVersion, Revision: testRevision, Epoch: testEpoch,
		Arch: runtime.GOARCH, Repository: "ghcr.io/meshca/meshca-hsm", Source: "https://github.com/meshca/meshca", Variant: "hsm"})
	if err != nil {
		return err
	}
	hsmBuilt.meta = m
	bin := filepath.Join(testDir, "hsm-build", "meshca")
	if err := buildBinary(ctx, m, bin); err != nil {
		return err
	}
	hsmBuilt.tar = filepath.Join(testDir, "hsm-image.tar")
	if _, err := pack(bin, m, hsmBuilt.tar); err != nil {
		return err
	}
	img, err := tarball.ImageFromPath(hsmBuilt.tar, nil)
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	if hsmBuilt.files, err = readTar(rc); err != nil {
		return err
	}
	hsmBuilt.root = filepath.Join(testDir, "hsm-rootfs")
	for _, e := range hsmBuilt.files {
		name := filepath.Join(hsmBuilt.root, filepath.FromSlash(e.Header.Name))
		if e.Header.Typeflag == tar.TypeDir {
			err = os.MkdirAll(name, 0o755)
		} else {
			err = os.WriteFile(name, e.Content, os.FileMode(e.Header.Mode))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// TestHSMImageFiles: the default image's files, and the dynamic loader
// and libc the binary names, at the paths it names them, and nothing else.
func TestHSMImageFiles(t *testing.T) {
	hsmFixture(t)
	interp, needed, err := dynamic(filepath.Join(hsmBuilt.root, binaryPath))
	if err != nil {
		t.Fatal(err)
	}
	if interp == "" {
		t.Fatal("the hsm variant's /meshca is static: it has no PT_INTERP")
	}
	if !slices.Equal(needed, []string{"libc.so.6"}) {
		t.Errorf("/meshca needs %q, want only libc.so.6 (netgo, osusergo: no NSS)", needed)
	}
	var names []string
	for _, e := range hsmBuilt.files {
		names = append(names, e.Header.Name)
		if e.Header.Uid != 0 || e.Header.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, want 0:0", e.Header.Name, e.Header.Uid, e.Header.Gid)
		}
	}
	triplet := triplets[runtime.GOARCH]
	want := []string{"etc/", "etc/group", "etc/passwd", "lib/", "lib/" + triplet + "/", "lib/" + triplet + "/libc.so.6", "meshca", "tmp/"}
	if dir := filepath.Dir(strings.TrimPrefix(interp, "/")); dir != "lib/"+triplet && dir != "lib" {
		want = append(want, dir+"/")
	}
	want = append(want, strings.TrimPrefix(interp, "/"))
	slices.Sort(want)
	want = slices.Compact(want)
	if !slices.Equal(names, want) {
		t.Errorf("layer holds %q, want %q", names, want)
	}
}

// TestHSMBinaryRunsOnImageLibc runs /meshca version on the image's own
// loader and libc, never this machine's: chrooted into the extracted
// layer when the test runs as root, else through the image's loader with
// the image's library directory only.
func TestHSMBinaryRunsOnImageLibc(t *testing.T) {
	hsmFixture(t)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("/"+binaryPath, "version")
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: hsmBuilt.root}
		cmd.Dir = "/"
	} else {
		interp, _, err := dynamic(filepath.Join(hsmBuilt.root, binaryPath))
		if err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(filepath.Join(hsmBuilt.root, interp), "--inhibit-cache",
			"--library-path", filepath.Join(hsmBuilt.root, "lib", triplets[runtime.GOARCH]),
			filepath.Join(hsmBuilt.root, binaryPath), "version")
	}
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("/meshca version on the image's libc: %v: %s", err, out)
	}
	want := regexp.MustCompile(`^meshca ` + regexp.QuoteMeta(testVersion) + ` .* pkcs11\n$`)
	if !want.Match(out) {
		t.Errorf("/meshca version printed %q, want it to match %s", out, want)
	}
}

func TestHSMImageConfig(t *testing.T) {
	hsmFixture(t)
	img, err := tarball.ImageFromPath(hsmBuilt.tar, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	libc6, err := dpkgVersion(context.Background(), "libc6")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, got, want string }{
		{"user", cf.Config.User, imageUser},
		{"entrypoint", fmt.Sprintf("%q", cf.Config.Entrypoint), `["/meshca"]`},
		{"label libc6", cf.Config.Labels[labelLibc6], libc6},
		{"history", cf.History[0].CreatedBy, "hack/image: go build -trimpath -tags pkcs11,netgo,osusergo ./cmd/meshca " + testVersion},
		{"comment", cf.History[0].Comment, "/meshca, /etc/passwd, /etc/group, /tmp, the dynamic loader and libc (Debian libc6 " + libc6 + ")"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %s, want %s", tt.got, tt.want)
			}
		})
	}
}

// TestMakeBuildIsStatic runs make build as a user does: bin/meshca must
// need no loader and no shared library, whatever the machine's cgo.
func TestMakeBuildIsStatic(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("make", "-C", "../..", "build", "BIN_DIR="+dir, "VERSION="+testVersion)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // as on a machine with a C compiler
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v: %s", err, out)
	}
	f, err := elf.Open(filepath.Join(dir, "meshca"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("make build's meshca has a PT_INTERP: it needs a dynamic loader (libraries %q)", libs)
		}
	}
	if len(libs) > 0 {
		t.Errorf("make build's meshca needs shared libraries: %q", libs)
	}
}

// TestMakefileHSMTags: make build-hsm and test-hsm build with the tags of
// the hsm image, with cgo.
func TestMakefileHSMTags(t *testing.T) {
	src, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	mk := string(src)
	for _, want := range []string{
		"HSM_TAGS := " + variants["hsm"].Tags + "\n",
		"CGO_ENABLED=1 $(GO) build -tags $(HSM_TAGS) ",
		"CGO_ENABLED=1 $(GO) test $(GOTEST_FLAGS) -tags $(HSM_TAGS) ",
		"CGO_ENABLED=0 $(GO) build ",
	} {
		if !strings.Contains(mk, want) {
			t.Errorf("the Makefile lacks %q", want)
		}
	}
}
