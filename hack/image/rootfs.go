package main

import (
	"archive/tar"
	"bytes"
	"path"
	"slices"
	"strings"
	"time"
)

// The nonroot user and group of the image, as distroless names them.
const (
	imageUser   = "65532:65532"
	binaryPath  = "meshca" // in the layer; /meshca in the container
	passwdLines = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n"
	groupLines = "root:x:0:\n" +
		"nonroot:x:65532:\n"
)

// A file is one entry of the image's only layer.
type file struct {
	Name    string // relative to /, directories ending in "/"
	Mode    int64  // permission bits, and the sticky bit for /tmp
	Content []byte // nil for a directory
}

// rootfs lists the layer's entries in the order they are written: every
// name sorted, each directory before what it holds. Everything is owned
// by 0:0; meshca runs as 65532 and writes only to /tmp (and to volumes).
// extra are more regular files (the hsm variant's loader and libc), their
// directories (0755) added.
func rootfs(binary []byte, extra ...file) []file {
	files := []file{
		{Name: "etc/", Mode: 0o755},
		{Name: "etc/group", Mode: 0o644, Content: []byte(groupLines)},
		{Name: "etc/passwd", Mode: 0o644, Content: []byte(passwdLines)},
		{Name: binaryPath, Mode: 0o755, Content: binary},
		{Name: "tmp/", Mode: 0o1777},
	}
	dirs := map[string]bool{"etc/": true, "tmp/": true}
	for _, f := range extra {
		for d := path.Dir(f.Name); d != "."; d = path.Dir(d) {
			if !dirs[d+"/"] {
				dirs[d+"/"] = true
				files = append(files, file{Name: d + "/", Mode: 0o755})
			}
		}
		files = append(files, f)
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.Name, b.Name) })
	return files
}

// layerTar writes files as an uncompressed tar in the ustar format, every
// time in it mtime, owners 0:0 without names: the same files and mtime
// give the same bytes.
func layerTar(files []file, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    f.Name,
			Mode:    f.Mode,
			ModTime: mtime,
			Format:  tar.FormatUSTAR,
		}
		if f.Content == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.Content))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Content); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
