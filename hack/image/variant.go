package main

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// A variant is one of meshca's images: the default one, static and from
// scratch, or hsm, whose meshca has the pkcs11 upstream and so is built
// with cgo and linked to libc, which the image then holds.
type variant struct {
	Name string // "" for the default image
	// Tags are the build tags; Cgo builds with CGO_ENABLED=1 and puts
	// the binary's dynamic loader and libraries in the image.
	Tags string
	Cgo  bool
	// Libc6 is the version of the Debian libc6 package whose files the
	// image holds; set by resolve for a Cgo variant.
	Libc6 string
	// Env is the image's environment.
	Env []string
}

// HSMLibDir is where the operator puts the vendor's PKCS#11 module and
// the libraries it needs beyond libc, in an image built FROM the hsm one
// or on a volume: the hsm image's LD_LIBRARY_PATH, so that dlopen finds
// what the module needs without a setting of the operator's.
const HSMLibDir = "/opt/hsm/lib"

// variants are the images hack/image makes, by -variant. hsm's tags are
// the Makefile's HSM_TAGS (build-hsm): the pkcs11 upstream, and Go's own
// resolver and user lookups, so that libc is all the binary needs (no
// nsswitch.conf, no NSS modules) besides the vendor's PKCS#11 module.
var variants = map[string]variant{
	"":    {},
	"hsm": {Name: "hsm", Tags: "pkcs11,netgo,osusergo", Cgo: true, Env: []string{"LD_LIBRARY_PATH=" + HSMLibDir}},
}

// buildFlags are the go build flags that make v's binary, as the image's
// history records them.
func (v variant) buildFlags() string {
	if v.Tags == "" {
		return ""
	}
	return "-tags " + v.Tags + " "
}

// comment names what v adds to the layer's files.
func (v variant) comment() string {
	if !v.Cgo {
		return ""
	}
	return ", the dynamic loader and libc (Debian libc6 " + v.Libc6 + ")"
}

// triplets are Debian's multiarch directories by GOARCH.
var triplets = map[string]string{
	"amd64":   "x86_64-linux-gnu",
	"arm64":   "aarch64-linux-gnu",
	"ppc64le": "powerpc64le-linux-gnu",
	"s390x":   "s390x-linux-gnu",
}

// hostLibs returns the files the dynamically linked binary at bin needs
// to start in an image of its own: its program interpreter (the dynamic
// loader) at the path the binary names, and every shared library it
// needs, and they need, in Debian's /lib/<triplet>, where the loader
// looks by default; each read from this machine, following symlinks.
func hostLibs(bin, arch string) ([]file, error) {
	triplet, ok := triplets[arch]
	if !ok {
		return nil, fmt.Errorf("no Debian multiarch directory known for %s", arch)
	}
	dirs := []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}
	interp, needed, err := dynamic(bin)
	if err != nil {
		return nil, err
	}
	if interp == "" {
		return nil, fmt.Errorf("%s has no program interpreter: it is static, not the hsm variant's binary", bin)
	}
	content, err := os.ReadFile(interp)
	if err != nil {
		return nil, fmt.Errorf("the dynamic loader: %w", err)
	}
	out := []file{{Name: strings.TrimPrefix(interp, "/"), Mode: 0o755, Content: content}}
	seen := map[string]bool{path.Base(interp): true}
	for len(needed) > 0 {
		lib := needed[0]
		needed = needed[1:]
		if seen[lib] {
			continue
		}
		seen[lib] = true
		host, err := find(lib, dirs)
		if err != nil {
			return nil, err
		}
		content, err := os.ReadFile(host)
		if err != nil {
			return nil, err
		}
		out = append(out, file{Name: "lib/" + triplet + "/" + lib, Mode: 0o755, Content: content})
		_, more, err := dynamic(host)
		if err != nil {
			return nil, err
		}
		needed = append(needed, more...)
	}
	return out, nil
}

// dynamic reads an ELF file's program interpreter and DT_NEEDED libraries.
func dynamic(name string) (interp string, needed []string, err error) {
	f, err := elf.Open(name)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", nil, fmt.Errorf("%s: PT_INTERP: %w", name, err)
			}
			interp = string(bytes.TrimRight(b, "\x00"))
		}
	}
	needed, err = f.ImportedLibraries()
	return interp, needed, err
}

// find is the first of dirs that holds lib.
func find(lib string, dirs []string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, lib)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("shared library %s is in none of %v", lib, dirs)
}

// dpkgVersion is the installed version of a Debian package.
func dpkgVersion(ctx context.Context, pkg string) (string, error) {
	out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Version}", pkg).Output()
	if err != nil || len(out) == 0 {
		return "", fmt.Errorf("the hsm variant takes libc from Debian's %s package: dpkg-query -W %s: %v", pkg, pkg, err)
	}
	return strings.TrimSpace(string(out)), nil
}
