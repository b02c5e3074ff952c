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
	return extract(hsmBuilt.files, hsmBuilt.root)
}

// extract writes a layer's directories and regular files under dir, with
// their modes.
func extract(files []entry, dir string) error {
	for _, e := range files {
		name := filepath.Join(dir, filepath.FromSlash(e.Header.Name))
		var err error
		if e.Header.Typeflag == tar.TypeDir {
			if err = os.MkdirAll(name, 0o755); err == nil {
				err = os.Chmod(name, os.FileMode(e.Header.Mode&0o777)|sticky(e.Header.Mode))
			}
		} else {
			err = os.WriteFile(name, e.Content, os.FileMode(e.Header.Mode))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func sticky(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
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
		{"env", fmt.Sprintf("%q", cf.Config.Env), `["LD_LIBRARY_PATH=/opt/hsm/lib"]`},
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

// TestHSMImageLoadsMountedModule does what docs/upstream.md tells an
// operator: the vendor's module, and the libraries it needs that the
// image lacks, in /opt/hsm/lib, which the image's own environment names
// in LD_LIBRARY_PATH. meshca, chrooted into the image's files as its user
// 65532 with the image's environment, makes a root key in a SoftHSM2
// token through that module.
func TestHSMImageLoadsMountedModule(t *testing.T) {
	hsmFixture(t)
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	const module = "/usr/lib/softhsm/libsofthsm2.so"
	if _, err := exec.LookPath("softhsm2-util"); err != nil {
		t.Fatalf("SoftHSM2 is required (hack/deps.sh installs it): %v", err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := extract(hsmBuilt.files, root); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(root, filepath.FromSlash(HSMLibDir))
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	// The module and what it needs beyond the image's libc and loader,
	// as ldd lists them.
	triplet := triplets[runtime.GOARCH]
	dirs := []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
	copied := map[string]bool{"libc.so.6": true}
	queue := []string{module}
	for len(queue) > 0 {
		src := queue[0]
		queue = queue[1:]
		content, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lib, filepath.Base(src)), content, 0o755); err != nil {
			t.Fatal(err)
		}
		interp, needed, err := dynamic(src)
		if err != nil {
			t.Fatal(err)
		}
		copied[filepath.Base(src)], copied[filepath.Base(interp)] = true, true
		for _, n := range needed {
			if !copied[n] {
				copied[n] = true
				p, err := find(n, dirs)
				if err != nil {
					t.Fatal(err)
				}
				queue = append(queue, p)
			}
		}
	}
	tokens := filepath.Join(root, "var", "softhsm", "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf := "objectstore.backend = file\nlog.level = ERROR\nslots.removable = false\ndirectories.tokendir = "
	hostConf := filepath.Join(t.TempDir(), "softhsm2.conf")
	write(hostConf, conf+tokens+"\n")
	write(filepath.Join(root, "etc", "softhsm2.conf"), conf+"/var/softhsm/tokens\n")
	write(filepath.Join(root, "etc", "pin"), "1234\n")
	initToken := exec.Command("softhsm2-util", "--init-token", "--free", "--label", "image", "--pin", "1234", "--so-pin", "5678")
	initToken.Env = append(os.Environ(), "SOFTHSM2_CONF="+hostConf)
	if out, err := initToken.CombinedOutput(); err != nil {
		t.Fatalf("softhsm2-util: %v: %s", err, out)
	}
	for _, p := range []string{filepath.Join(root, "var"), filepath.Join(root, "etc", "softhsm2.conf"), filepath.Join(root, "etc", "pin")} {
		if err := filepath.Walk(p, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, 65532, 65532)
		}); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("/"+binaryPath, "root", "prepare", "--state-dir", "/tmp/state", "--upstream", "pkcs11",
		"--pkcs11-module", HSMLibDir+"/libsofthsm2.so", "--pkcs11-token-label", "image", "--pkcs11-pin-file", "/etc/pin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
	cmd.Dir = "/"
	img, err := tarball.ImageFromPath(hsmBuilt.tar, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(slices.Clone(cf.Config.Env), "SOFTHSM2_CONF=/etc/softhsm2.conf")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("meshca root prepare --upstream pkcs11 in the image: %v: %s", err, out)
	}
	if !strings.Contains(string(out), `"event":"intermediate","decision":"issued"`) || !strings.Contains(string(out), `"upstream":"pkcs11"`) {
		t.Fatalf("root prepare in the image issued no intermediate from the token:\n%s", out)
	}
}
