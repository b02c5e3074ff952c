package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

const (
	testVersion  = "v0.0.0-imagetest+abc" // '+' is not allowed in a tag: the tag has '-'
	testTag      = "ghcr.io/meshca/meshca:v0.0.0-imagetest-abc"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	testEpoch    = "1700000000"
	testCreated  = "2023-11-14T22:13:20Z"
)

// built is what the tests share: meshca built once from this repository,
// packed twice into tarballs, and the files of the first one's layer.
var built struct {
	once  sync.Once
	err   error
	meta  meta
	tars  [2]string
	res   [2]written
	files []entry // the layer's entries, in order
	bin   string  // /meshca extracted from the first tarball
}

// An entry is one file of a tar: its header and content.
type entry struct {
	Header  *tar.Header
	Content []byte
}

var testDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshca-image-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture builds the image once for every test that needs it.
func fixture(t *testing.T) {
	t.Helper()
	built.once.Do(func() { built.err = buildFixture(context.Background()) })
	if built.err != nil {
		t.Fatal(built.err)
	}
}

func buildFixture(ctx context.Context) error {
	m, err := resolve(ctx, options{Root: "../..", Version: testVersion, Revision: testRevision, Epoch: testEpoch,
		Arch: runtime.GOARCH, Repository: "ghcr.io/meshca/meshca", Source: "https://github.com/meshca/meshca"})
	if err != nil {
		return err
	}
	built.meta = m
	bin := filepath.Join(testDir, "build", "meshca")
	if err := buildBinary(ctx, m, bin); err != nil {
		return err
	}
	for i := range built.tars {
		built.tars[i] = filepath.Join(testDir, fmt.Sprintf("image%d.tar", i))
		if built.res[i], err = pack(bin, m, built.tars[i]); err != nil {
			return err
		}
	}
	// Read it back as docker load would, through manifest.json.
	img, err := tarball.ImageFromPath(built.tars[0], nil)
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if len(layers) != 1 {
		return fmt.Errorf("image has %d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	if built.files, err = readTar(rc); err != nil {
		return err
	}
	for _, e := range built.files {
		if e.Header.Name == binaryPath {
			built.bin = filepath.Join(testDir, "rootfs", "meshca")
			if err := os.MkdirAll(filepath.Dir(built.bin), 0o755); err != nil {
				return err
			}
			return os.WriteFile(built.bin, e.Content, 0o755)
		}
	}
	return fmt.Errorf("no %s in the layer", binaryPath)
}

func readTar(r io.Reader) ([]entry, error) {
	var out []entry
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		out = append(out, entry{h, content})
	}
}

func TestImageIsReproducible(t *testing.T) {
	fixture(t)
	if built.res[0] != built.res[1] {
		t.Errorf("two packs of one build differ: %+v and %+v", built.res[0], built.res[1])
	}
	a, err := os.ReadFile(built.tars[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(built.tars[1])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("two packs of one build are not the same bytes (%d and %d)", len(a), len(b))
	}
	if int64(len(a)) != built.res[0].Size {
		t.Errorf("tarball has %d bytes, pack said %d", len(a), built.res[0].Size)
	}
}

func TestImageConfig(t *testing.T) {
	fixture(t)
	img, err := tarball.ImageFromPath(built.tars[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img, validate.Fast); err != nil { // TestOCILayout reads the layer
		t.Fatalf("docker manifest.json view: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	var ports []string
	for p := range c.ExposedPorts {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	tests := []struct{ name, got, want string }{
		{"user", c.User, "65532:65532"},
		{"entrypoint", fmt.Sprintf("%q", c.Entrypoint), `["/meshca"]`},
		{"cmd", fmt.Sprintf("%q", c.Cmd), `["serve"]`},
		{"working dir", c.WorkingDir, "/"},
		{"env", fmt.Sprintf("%q", c.Env), `[]`},
		{"exposed ports", strings.Join(ports, " "), "15012/tcp 15014/tcp"},
		{"os", cf.OS, "linux"},
		{"architecture", cf.Architecture, runtime.GOARCH},
		{"created", cf.Created.UTC().Format(time.RFC3339), testCreated},
		{"history", fmt.Sprintf("%d %s", len(cf.History), cf.History[0].Created.UTC().Format(time.RFC3339)), "1 " + testCreated},
		{"label version", c.Labels[labelVersion], testVersion},
		{"label revision", c.Labels[labelRevision], testRevision},
		{"label source", c.Labels[labelSource], "https://github.com/meshca/meshca"},
		{"label created", c.Labels[labelCreated], testCreated},
		{"labels", fmt.Sprint(len(c.Labels)), "4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %s, want %s", tt.got, tt.want)
			}
		})
	}
}

func TestImageFiles(t *testing.T) {
	fixture(t)
	tests := []struct {
		name    string
		typ     byte
		mode    int64
		content string // checked when not empty
	}{
		{"etc/", tar.TypeDir, 0o755, ""},
		{"etc/group", tar.TypeReg, 0o644, "root:x:0:\nnonroot:x:65532:\n"},
		{"etc/passwd", tar.TypeReg, 0o644, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n"},
		{"meshca", tar.TypeReg, 0o755, ""},
		{"tmp/", tar.TypeDir, 0o1777, ""},
	}
	var names []string
	for _, e := range built.files {
		names = append(names, e.Header.Name)
	}
	if len(built.files) != len(tests) {
		t.Fatalf("layer holds %q, want exactly the %d files below", names, len(tests))
	}
	want, _ := parseEpoch(testEpoch)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := built.files[i].Header
			switch {
			case h.Name != tt.name:
				t.Fatalf("entry %d is %q, want %q (layer: %q)", i, h.Name, tt.name, names)
			case h.Typeflag != tt.typ:
				t.Errorf("type %q, want %q", h.Typeflag, tt.typ)
			case h.Mode != tt.mode:
				t.Errorf("mode %#o, want %#o", h.Mode, tt.mode)
			case h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "":
				t.Errorf("owner %d:%d (%q:%q), want 0:0", h.Uid, h.Gid, h.Uname, h.Gname)
			case !h.ModTime.Equal(want):
				t.Errorf("mtime %v, want SOURCE_DATE_EPOCH %v", h.ModTime, want)
			case tt.content != "" && string(built.files[i].Content) != tt.content:
				t.Errorf("content %q, want %q", built.files[i].Content, tt.content)
			}
		})
	}
}

func TestBinaryIsStatic(t *testing.T) {
	fixture(t)
	f, err := elf.Open(built.bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/meshca has a PT_INTERP program header: it needs a dynamic loader")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) > 0 {
		t.Errorf("/meshca needs shared libraries (DT_NEEDED): %q", libs)
	}
}

func TestBinaryPrintsVersion(t *testing.T) {
	fixture(t)
	out, err := exec.Command(built.bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("/meshca version: %v: %s", err, out)
	}
	if want := "meshca " + testVersion + " "; !strings.HasPrefix(string(out), want) {
		t.Errorf("/meshca version printed %q, want it to start with %q", out, want)
	}
}

// TestOCILayout reads the tarball as podman, skopeo and crane read an OCI
// image layout: index.json names the manifest whose digest run printed.
func TestOCILayout(t *testing.T) {
	fixture(t)
	dir := filepath.Join(testDir, "layout")
	if err := untar(built.tars[0], dir); err != nil {
		t.Fatal(err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(im.Manifests))
	}
	d := im.Manifests[0]
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("OCI layout view: %v", err)
	}
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	docker, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(built.tars[0]) })
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"manifest digest", d.Digest, built.res[0].Manifest},
		{"manifest media type", d.MediaType, types.OCIManifestSchema1},
		{"config digest", mf.Config.Digest, built.res[0].Config},
		{"config media type", mf.Config.MediaType, types.OCIConfigJSON},
		{"layer media type", mf.Layers[0].MediaType, types.OCILayer},
		{"platform", d.Platform.String(), "linux/" + runtime.GOARCH},
		{"ref.name", d.Annotations[annotationRefName], testTag},
		{"containerd name", d.Annotations[annotationContainer], testTag},
		{"docker RepoTags", fmt.Sprint(docker[0].RepoTags), "[" + testTag + "]"},
		{"docker Config", docker[0].Config, blobPath(built.res[0].Config)},
		{"docker Layers", fmt.Sprint(docker[0].Layers), fmt.Sprint([]string{blobPath(mf.Layers[0].Digest)})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

// untar extracts the regular files and directories of the tarball at path
// into dir.
func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	entries, err := readTar(f)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := filepath.Join(dir, filepath.FromSlash(e.Header.Name))
		if !strings.HasPrefix(name, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("entry %q is outside the archive", e.Header.Name)
		}
		switch e.Header.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(name, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(name), 0o755); err == nil {
				err = os.WriteFile(name, e.Content, 0o644)
			}
		default:
			err = fmt.Errorf("entry %q: unexpected type %q", e.Header.Name, e.Header.Typeflag)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
