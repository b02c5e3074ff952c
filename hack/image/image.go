package main

import (
	"bytes"
	"compress/gzip"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The OCI annotation keys the image's labels use.
const (
	labelVersion  = "org.opencontainers.image.version"
	labelRevision = "org.opencontainers.image.revision"
	labelSource   = "org.opencontainers.image.source"
	labelCreated  = "org.opencontainers.image.created"
	// labelLibc6 is the Debian libc6 version whose loader and libc the
	// hsm variant holds.
	labelLibc6 = "io.meshca.libc6"
)

// The ports meshca listens on by default: gRPC, and /metrics with the probes.
var exposedPorts = []string{"15012/tcp", "15014/tcp"}

// newImage makes meshca's image from its binary and the libraries it
// needs (none for the default variant): OCI media types, one gzip layer
// (rootfs), and a config that runs /meshca serve as 65532.
func newImage(binary []byte, libs []file, m meta) (v1.Image, error) {
	raw, err := layerTar(rootfs(binary, libs...), m.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: m.Created},
			CreatedBy: "hack/image: go build -trimpath " + m.Variant.buildFlags() + "./cmd/meshca " + m.Version,
			Comment:   "/meshca, /etc/passwd, /etc/group, /tmp" + m.Variant.comment(),
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = m.Arch
	cf.OS = "linux"
	cf.Created = v1.Time{Time: m.Created}
	cf.Config = config(m)
	return mutate.ConfigFile(img, cf)
}

// config is what a runtime reads to start the container.
func config(m meta) v1.Config {
	labels := map[string]string{
		labelVersion: m.Version,
		labelSource:  m.Source,
		labelCreated: m.Created.Format("2006-01-02T15:04:05Z"),
	}
	if m.Revision != "" {
		labels[labelRevision] = m.Revision
	}
	if m.Variant.Libc6 != "" {
		labels[labelLibc6] = m.Variant.Libc6
	}
	ports := map[string]struct{}{}
	for _, p := range exposedPorts {
		ports[p] = struct{}{}
	}
	return v1.Config{
		User:         imageUser,
		Entrypoint:   []string{"/" + binaryPath},
		Cmd:          []string{"serve"},
		WorkingDir:   "/",
		Labels:       labels,
		ExposedPorts: ports,
		Env:          m.Variant.Env,
	}
}
