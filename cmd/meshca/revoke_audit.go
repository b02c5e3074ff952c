package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// The audit log as meshca revoke reads it: meshca's own certificate
// events, one JSON object per line (ca.AuditLog), from a file or a
// stream that may mix other logs in.

// Bounds of the audit log reader.
const (
	// maxAuditLine bounds one line: a longer one is counted broken and
	// skipped, never held whole. meshca's longest event, the
	// configuration, is a few tens of KiB.
	maxAuditLine = 1 << 20
	// maxBrokenShown is how many broken lines' numbers a report names.
	maxBrokenShown = 10
)

// issuance is one certificate meshca issued, as its audit event says.
type issuance struct {
	Line      int
	Time      time.Time
	Event     string
	Serial    *big.Int
	Issuer    string // empty: the event does not say (an older meshca)
	NotAfter  time.Time
	Identity  string
	Node      string // the caller's node
	ProxyNode string // the node whose proxy it was issued through
	Requested string
}

// throughNode reports whether the certificate was issued from node: to
// its proxy or through it (proxy_node), to a caller whose token is bound
// to a Pod on it (node), or to a Pod of the node at its kubelet's request
// (a pod certificate's node). Its key was on the node.
func (c *issuance) throughNode(node string) bool {
	return c.Event != "istiod_certificate" && (c.ProxyNode == node || c.Node == node)
}

// auditScan is what reading an audit log found besides its issuances.
type auditScan struct {
	Lines  int // lines read
	Events int // audit events among them (of any kind)
	// Broken counts lines that are not a JSON object, longer than
	// maxAuditLine, or an issued certificate's event that does not say
	// what; BrokenAt the first maxBrokenShown of their numbers.
	Broken   int
	BrokenAt []int
	// Nodes are the nodes named by any certificate event, issued or not.
	Nodes map[string]bool
}

// auditLine is the part of an audit event meshca revoke reads.
type auditLine struct {
	Audit     bool      `json:"audit"`
	Time      time.Time `json:"time"`
	Event     string    `json:"event"`
	Decision  string    `json:"decision"`
	Serial    string    `json:"serial"`
	Issuer    string    `json:"issuer"`
	NotAfter  time.Time `json:"not_after"`
	Identity  string    `json:"identity"`
	Node      string    `json:"node"`
	ProxyNode string    `json:"proxy_node"`
	Requested string    `json:"requested"`
}

// issuanceEvents are the events of a certificate meshca issued.
var issuanceEvents = map[string]bool{"certificate": true, "pod_certificate": true, "istiod_certificate": true}

// readAuditLog streams the audit log r (gzip-compressed or not) and
// calls found for every certificate it records as issued. A broken line
// is counted, never fatal; reading fails only when r cannot be read, or
// holds lines of which none is JSON.
func readAuditLog(r io.Reader, found func(*issuance)) (*auditScan, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		defer z.Close()
		br = bufio.NewReaderSize(z, 64<<10)
	}
	scan := &auditScan{Nodes: map[string]bool{}}
	jsonLines := 0
	for {
		line, tooLong, err := readLine(br)
		if len(line) > 0 || tooLong {
			scan.Lines++
			if ok := scan.take(line, tooLong, found); ok {
				jsonLines++
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return scan, fmt.Errorf("after line %d: %w", scan.Lines, err)
		}
	}
	if scan.Lines > 0 && jsonLines == 0 {
		return scan, fmt.Errorf("none of its %d lines is a JSON object (broken: %s): is it meshca's audit log?", scan.Lines, scan.brokenList())
	}
	return scan, nil
}

// readLine returns the next line without its end, or reports it longer
// than maxAuditLine (then it has been skipped to its end).
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) > maxAuditLine {
			tooLong, buf = true, nil
		} else if !tooLong {
			buf = append(buf, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(buf, "\r\n"), tooLong, err
	}
}

// take reads one line; it reports whether the line was a JSON object.
func (s *auditScan) take(line []byte, tooLong bool, found func(*issuance)) bool {
	line = bytes.TrimSpace(line)
	if len(line) == 0 && !tooLong {
		s.Lines--
		return false
	}
	var l auditLine
	if tooLong || len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &l) != nil {
		s.broke()
		return false
	}
	if !l.Audit {
		return true // another log's line in the same stream
	}
	s.Events++
	if l.Event == "certificate" && l.Node != "" {
		s.Nodes[l.Node] = true
	}
	if l.ProxyNode != "" {
		s.Nodes[l.ProxyNode] = true
	}
	if !issuanceEvents[l.Event] || l.Decision != "issued" {
		return true
	}
	serial, ok := new(big.Int).SetString(l.Serial, 16)
	if !ok || serial.Sign() <= 0 || l.NotAfter.IsZero() {
		s.broke()
		return true
	}
	found(&issuance{Line: s.Lines, Time: l.Time, Event: l.Event, Serial: serial, Issuer: strings.ToLower(l.Issuer), NotAfter: l.NotAfter,
		Identity: l.Identity, Node: l.Node, ProxyNode: l.ProxyNode, Requested: l.Requested})
	return true
}

func (s *auditScan) broke() {
	s.Broken++
	if len(s.BrokenAt) < maxBrokenShown {
		s.BrokenAt = append(s.BrokenAt, s.Lines)
	}
}

// brokenList names the broken lines: "3, 9 and 12 more".
func (s *auditScan) brokenList() string {
	nums := make([]string, len(s.BrokenAt))
	for i, n := range s.BrokenAt {
		nums[i] = strconv.Itoa(n)
	}
	out := "lines " + strings.Join(nums, ", ")
	if more := s.Broken - len(s.BrokenAt); more > 0 {
		out += fmt.Sprintf(" and %d more", more)
	}
	return out
}

// warning is what the operator is told of the broken lines, or "".
func (s *auditScan) warning(name string) string {
	if s.Broken == 0 {
		return ""
	}
	return fmt.Sprintf("warning: %s: %d of %d lines could not be read and were skipped (%s)", name, s.Broken, s.Lines, s.brokenList())
}
