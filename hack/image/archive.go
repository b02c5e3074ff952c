package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The annotations that name the image in index.json: the OCI one, which
// podman and skopeo read, and containerd's, which docker load reads when
// it uses the containerd image store.
const (
	annotationRefName   = "org.opencontainers.image.ref.name"
	annotationContainer = "io.containerd.image.name"
)

// written is what writeArchive wrote.
type written struct {
	Manifest v1.Hash // the image manifest's digest
	Config   v1.Hash // the config's digest: docker's image ID
	Size     int64   // bytes of the tarball
}

// writeArchive writes img to w as an OCI image layout in a tar, the
// format docker save writes since Docker 25: oci-layout, index.json
// naming ref, blobs/sha256/<hex> for the manifest, config and layers, and
// a docker manifest.json naming the same blobs, so that docker load
// (either image store), podman load, skopeo (oci-archive:) and
// go-containerregistry's tarball package all read it. Every entry has the
// config's creation time: the same image gives the same bytes.
func writeArchive(w io.Writer, img v1.Image, ref name.Tag) (written, error) {
	var res written
	cf, err := img.ConfigFile()
	if err != nil {
		return res, err
	}
	if res.Manifest, err = img.Digest(); err != nil {
		return res, err
	}
	if res.Config, err = img.ConfigName(); err != nil {
		return res, err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return res, err
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return res, err
	}
	layers, err := img.Layers()
	if err != nil {
		return res, err
	}
	mediaType, err := img.MediaType()
	if err != nil {
		return res, err
	}
	idx, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   mediaType,
			Size:        int64(len(manifest)),
			Digest:      res.Manifest,
			Platform:    &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
			Annotations: map[string]string{annotationRefName: ref.Name(), annotationContainer: ref.Name()},
		}},
	})
	if err != nil {
		return res, err
	}
	docker := tarball.Manifest{{Config: blobPath(res.Config), RepoTags: []string{ref.String()}}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return res, err
		}
		docker[0].Layers = append(docker[0].Layers, blobPath(d))
	}
	dockerJSON, err := json.Marshal(docker)
	if err != nil {
		return res, err
	}

	cw := &countingWriter{w: w}
	aw := archiveWriter{tw: tar.NewWriter(cw), mtime: cf.Created.Time}
	aw.file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	aw.file("index.json", idx)
	aw.file("manifest.json", dockerJSON)
	aw.dir("blobs/")
	aw.dir("blobs/sha256/")
	aw.file(blobPath(res.Config), rawConfig)
	for _, l := range layers {
		aw.layer(l)
	}
	aw.file(blobPath(res.Manifest), manifest)
	if aw.err != nil {
		return res, aw.err
	}
	if err := aw.tw.Close(); err != nil {
		return res, err
	}
	res.Size = cw.n
	return res, nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// archiveWriter writes tar entries owned by 0:0 with one mtime, keeping
// the first error.
type archiveWriter struct {
	tw    *tar.Writer
	mtime time.Time
	err   error
}

func (a *archiveWriter) dir(name string) {
	a.entry(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}, nil)
}

func (a *archiveWriter) file(name string, content []byte) {
	a.entry(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))}, bytes.NewReader(content))
}

// layer writes l's compressed bytes as its blob, checking their size.
func (a *archiveWriter) layer(l v1.Layer) {
	if a.err != nil {
		return
	}
	d, err := l.Digest()
	if err != nil {
		a.err = err
		return
	}
	size, err := l.Size()
	if err != nil {
		a.err = err
		return
	}
	rc, err := l.Compressed()
	if err != nil {
		a.err = err
		return
	}
	defer rc.Close()
	a.entry(&tar.Header{Name: blobPath(d), Typeflag: tar.TypeReg, Mode: 0o644, Size: size}, rc)
}

func (a *archiveWriter) entry(h *tar.Header, content io.Reader) {
	if a.err != nil {
		return
	}
	h.ModTime = a.mtime
	h.Format = tar.FormatUSTAR
	if a.err = a.tw.WriteHeader(h); a.err != nil || content == nil {
		return
	}
	n, err := io.Copy(a.tw, content)
	switch {
	case err != nil:
		a.err = fmt.Errorf("%s: %w", h.Name, err)
	case n != h.Size:
		a.err = fmt.Errorf("%s: wrote %d bytes, want %d", h.Name, n, h.Size)
	}
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
