// Command image builds meshca's container image without a container
// daemon, as make image does: a reproducible static build of ./cmd/meshca
// packed with go-containerregistry into one OCI image layout tarball that
// docker load, podman load and skopeo (oci-archive:) read.
//
// Run it from this directory, naming the repository root:
//
//	go run . -root ../.. -version "$(git describe --tags --always --dirty)" -out ../../_out/meshca-image.tar
//
// The image has one layer: /meshca, /etc/passwd and /etc/group with the
// nonroot user and group 65532, and /tmp (1777). It holds no CA
// certificates: meshca's peers are in-cluster or given with their roots
// (the apiserver's from its service account or kubeconfig; Vault's and
// cfssl's by --vault-ca-file and --cfssl-tls-ca-file, or a mounted bundle
// named by SSL_CERT_FILE). Every time in it (the config's, the history's,
// the layer's files') is SOURCE_DATE_EPOCH, by default the commit time of
// HEAD, so the same tree and toolchain give the same digest.
//
// With -variant hsm it makes the HSM variant (make image-hsm): meshca
// built with cgo and the build tag pkcs11, and beside it the dynamic
// loader and libc.so.6 it links to, taken from this machine's Debian
// libc6 (its version is the label io.meshca.libc6); the operator mounts
// the vendor's PKCS#11 module.
//
// It prints the manifest digest (what a registry will call the image once
// pushed with skopeo or crane from the layout) and the config digest (what
// docker load prints as the image ID).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
)

// options is everything one build of the image depends on.
type options struct {
	Root       string // repository root, holding the product go.mod
	Out        string // the tarball to write
	Version    string // stamped into main.version and the version label
	Revision   string // the git commit, for the revision label
	Epoch      string // SOURCE_DATE_EPOCH: seconds since 1970, every time in the image
	Arch       string // GOARCH of the binary and the image
	Repository string // the image's name, tagged with Version
	Source     string // the source label
	Variant    string // "" for the default image, hsm for the HSM variant
}

func main() {
	var o options
	flag.StringVar(&o.Root, "root", "../..", "repository root, holding the product go.mod")
	flag.StringVar(&o.Out, "out", "../../_out/meshca-image.tar", "the OCI image layout tarball to write")
	flag.StringVar(&o.Version, "version", "", "version to stamp (default: git describe --tags --always --dirty)")
	flag.StringVar(&o.Revision, "revision", "", "git commit for the revision label (default: git rev-parse HEAD)")
	flag.StringVar(&o.Epoch, "source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"),
		"seconds since 1970 for every time in the image (default: $SOURCE_DATE_EPOCH, else HEAD's commit time)")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH of the binary and the image")
	flag.StringVar(&o.Repository, "repository", "ghcr.io/meshca/meshca", "the image's name, tagged with the version")
	flag.StringVar(&o.Variant, "variant", "", "the image: empty for the default one (static, from scratch), hsm for the HSM variant (the pkcs11 upstream, with the dynamic loader and libc)")
	flag.StringVar(&o.Source, "source", "https://github.com/meshca/meshca", "the source label")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// run builds meshca, packs it and writes the tarball, printing what it made.
func run(ctx context.Context, o options, stdout io.Writer) error {
	m, err := resolve(ctx, o)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "meshca-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "meshca")
	if err := buildBinary(ctx, m, bin); err != nil {
		return err
	}
	res, err := pack(bin, m, o.Out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image: %s (OCI image layout tarball with a docker manifest.json, %d bytes)\n"+
		"reference: %s\nmanifest digest: %s\nconfig digest (docker image ID): %s\n",
		o.Out, res.Size, m.Ref, res.Manifest, res.Config)
	return nil
}

// pack makes the image of the binary at bin and writes it to out, through a
// temporary file renamed into place.
func pack(bin string, m meta, out string) (written, error) {
	content, err := os.ReadFile(bin)
	if err != nil {
		return written{}, err
	}
	var libs []file
	if m.Variant.Cgo {
		if libs, err = hostLibs(bin, m.Arch); err != nil {
			return written{}, err
		}
	}
	img, err := newImage(content, libs, m)
	if err != nil {
		return written{}, err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return written{}, err
	}
	f, err := os.CreateTemp(filepath.Dir(out), ".meshca-image-*")
	if err != nil {
		return written{}, err
	}
	defer os.Remove(f.Name())
	res, err := writeArchive(f, img, m.Ref)
	if err != nil {
		f.Close()
		return written{}, err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return written{}, err
	}
	if err := f.Close(); err != nil {
		return written{}, err
	}
	return res, os.Rename(f.Name(), out)
}
