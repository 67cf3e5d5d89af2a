// Checks -case and -profdir: which rows run, and that each row's CPU
// profile is written with its samples labelled by group, case, conc and
// side. Talks to nothing but a made-up group that burns CPU in-process,
// and, for the file names, the in-memory store (memstore).
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// spinGroup registers a group "spin" whose rows "burn" (conc 1 and 2) and
// "burn twice" burn CPU on both sides, until the test ends. Each side
// reports the side label it runs under into got.
func spinGroup(t *testing.T, got *[]string) {
	t.Helper()
	oldGroups := groups
	groups = append(append([]string(nil), groups...), "spin")
	setups["spin"] = func(context.Context, config) ([]row, func(), error) {
		burn := func(name string) side {
			return side{name, func(ctx context.Context, _ int, _ int64) (time.Duration, error) {
				label, _ := pprof.Label(ctx, "side")
				*got = append(*got, label)
				start := time.Now()
				burnCPU(100 * time.Millisecond)
				return time.Since(start), nil
			}}
		}
		return []row{
			{name: "burn", conc: 1, n: 1, raw: burn("r"), dq: burn("d")},
			{name: "burn", conc: 2, n: 1, raw: burn("r"), dq: burn("d")},
			{name: "burn twice", conc: 1, n: 1, raw: burn("r"), dq: burn("d")},
		}, func() {}, nil
	}
	t.Cleanup(func() {
		groups = oldGroups
		delete(setups, "spin")
	})
}

// burnCPU spins until this process has used d more CPU time, so that a
// CPU profile (100 samples per CPU second) gets samples however loaded the
// machine is.
func burnCPU(d time.Duration) {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for end, x := cpu()+d, 1; cpu() < end; {
		for i := range 100_000 {
			x = x*31 + i
		}
		sink = x
	}
}

var sink int

func TestCaseFilter(t *testing.T) {
	cases := []struct {
		filter string
		want   []string // rows run, as "case conc"
		err    string
	}{
		{"", []string{"burn 1", "burn 2", "burn twice 1"}, ""},
		{"burn", []string{"burn 1", "burn 2"}, ""}, // the exact name wins
		{"twice", []string{"burn twice 1"}, ""},    // else a substring
		{"urn", []string{"burn 1", "burn 2", "burn twice 1"}, ""},
		{"nope", nil, `no row of spin has a case matching -case "nope"`},
	}
	for _, tc := range cases {
		t.Run(tc.filter, func(t *testing.T) {
			var labels []string
			spinGroup(t, &labels)
			var out bytes.Buffer
			err := run(context.Background(), []string{"-quick", "-only", "spin", "-case", tc.filter}, &out)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ran []string
			for _, line := range strings.Split(out.String(), "\n") {
				if f := strings.Split(line, " | "); len(f) > 3 && f[0] == "| spin" {
					ran = append(ran, f[1]+" "+f[2])
				}
			}
			if fmt.Sprint(ran) != fmt.Sprint(tc.want) {
				t.Errorf("rows run %q, want %q\n%s", ran, tc.want, out.String())
			}
			if want := strings.Repeat("raw dedupq ", len(tc.want)); fmt.Sprint(labels) != fmt.Sprint(strings.Fields(want)) {
				t.Errorf("sides ran under side labels %q, want raw then dedupq per row", labels)
			}
		})
	}
}

func TestProfDir(t *testing.T) {
	var labels []string
	spinGroup(t, &labels)
	dir := filepath.Join(t.TempDir(), "prof") // made by the run
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-quick", "-only", "spin,memstore", "-profdir", dir}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, name := range []string{"memstore-claim+complete-1", "memstore-claim+complete-16", "memstore-claim+complete-64", "spin-burn-1", "spin-burn-2", "spin-burn_twice-1"} {
		path := filepath.Join(dir, name+".prof")
		if !strings.Contains(out.String(), path) {
			t.Errorf("output does not list %s:\n%s", path, out.String())
		}
		samples, err := profileLabels(path)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !strings.HasPrefix(name, "spin-") {
			continue // too short to be sure of a sample
		}
		// Each side burnt 100 ms of CPU, about 10 samples.
		cs, conc, _ := strings.Cut(strings.TrimPrefix(name, "spin-"), "-")
		want := map[string]bool{}
		for _, s := range []string{"raw", "dedupq"} {
			set := fmt.Sprintf("case=%s conc=%s group=spin side=%s", strings.ReplaceAll(cs, "_", " "), conc, s)
			want[set] = true
			if samples[set] == 0 {
				t.Errorf("%s: no sample labelled %q; label sets: %v", name, set, samples)
			}
		}
		for set := range samples {
			if set != "" && !want[set] {
				t.Errorf("%s holds samples labelled %q, not of its row", name, set)
			}
		}
	}
}

func TestProfDirWithCPUProfile(t *testing.T) {
	dir := t.TempDir()
	err := run(context.Background(), []string{"-quick", "-only", "memstore", "-profdir", dir, "-cpuprofile", filepath.Join(dir, "cpu.prof")}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "one CPU profile at a time") {
		t.Fatalf("got %v, want a refusal of both flags", err)
	}
}

// profileLabels reads a pprof CPU profile (gzipped profile.proto) and
// counts its samples by label set, written "k=v k=v" in key order.
func profileLabels(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("empty profile")
	}
	// Profile: 2 sample, 6 string_table. Sample: 3 label. Label: 1 key,
	// 2 str (indexes into the string table).
	var strs []string
	var sampleMsgs [][]byte
	err = protoFields(b, func(field int, v uint64, data []byte) error {
		switch field {
		case 2:
			sampleMsgs = append(sampleMsgs, data)
		case 6:
			strs = append(strs, string(data))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	str := func(i uint64) (string, error) {
		if i >= uint64(len(strs)) {
			return "", fmt.Errorf("string index %d of %d", i, len(strs))
		}
		return strs[i], nil
	}
	counts := map[string]int{}
	for _, sm := range sampleMsgs {
		var set []string
		err := protoFields(sm, func(field int, _ uint64, data []byte) error {
			if field != 3 {
				return nil
			}
			var k, v string
			return protoFields(data, func(field int, n uint64, _ []byte) error {
				var err error
				switch field {
				case 1:
					k, err = str(n)
				case 2:
					if v, err = str(n); err == nil {
						set = append(set, k+"="+v)
					}
				}
				return err
			})
		})
		if err != nil {
			return nil, err
		}
		slices.Sort(set)
		counts[strings.Join(set, " ")]++
	}
	return counts, nil
}

// protoFields calls f for each field of a protobuf message: its number and
// its varint value, or its bytes for a length-delimited one.
func protoFields(b []byte, f func(field int, v uint64, data []byte) error) error {
	varint := func() (uint64, error) {
		var x uint64
		for shift := 0; shift < 64; shift += 7 {
			if len(b) == 0 {
				return 0, io.ErrUnexpectedEOF
			}
			c := b[0]
			b = b[1:]
			x |= uint64(c&0x7f) << shift
			if c < 0x80 {
				return x, nil
			}
		}
		return 0, errors.New("varint overflow")
	}
	for len(b) > 0 {
		key, err := varint()
		if err != nil {
			return err
		}
		field, wire := int(key>>3), key&7
		var v uint64
		var data []byte
		switch wire {
		case 0:
			if v, err = varint(); err != nil {
				return err
			}
		case 1:
			if len(b) < 8 {
				return io.ErrUnexpectedEOF
			}
			b = b[8:]
		case 2:
			n, err := varint()
			if err != nil {
				return err
			}
			if uint64(len(b)) < n {
				return io.ErrUnexpectedEOF
			}
			data, b = b[:n], b[n:]
		case 5:
			if len(b) < 4 {
				return io.ErrUnexpectedEOF
			}
			b = b[4:]
		default:
			return fmt.Errorf("wire type %d", wire)
		}
		if err := f(field, v, data); err != nil {
			return err
		}
	}
	return nil
}
