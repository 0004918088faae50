package benchkit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"
)

// userHz is the unit of utime/stime in /proc/<pid>/stat. The kernel reports these
// in USER_HZ, which Linux fixes at 100 for user space on every architecture it
// supports (sysconf(_SC_CLK_TCK) returns it), so no cgo is needed to read it.
const userHz = 100

// ErrProc reports that a process's statistics could not be read or parsed.
var ErrProc = errors.New("benchkit: reading process statistics")

// ProcSample is one reading of a process's memory and CPU time.
type ProcSample struct {
	At       time.Time     // when the sample was taken (from the engine's clock)
	RSSBytes uint64        // VmRSS: resident set size now
	HWMBytes uint64        // VmHWM: peak resident set size since the process started
	CPU      time.Duration // user + system CPU time consumed so far
}

// ReadProc samples process pid from a procfs mounted as fsys (os.DirFS("/proc") in
// production, an fstest.MapFS in tests). It reads <pid>/status for VmRSS and VmHWM
// and <pid>/stat for utime and stime.
func ReadProc(fsys fs.FS, pid int, now time.Time) (ProcSample, error) {
	s := ProcSample{At: now}
	status, err := fs.ReadFile(fsys, strconv.Itoa(pid)+"/status")
	if err != nil {
		return s, fmt.Errorf("%w: pid %d: %w", ErrProc, pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	var sawRSS bool
	for sc.Scan() {
		line := sc.Text()
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch key {
		case "VmRSS", "VmHWM":
			kb, err := parseKB(val)
			if err != nil {
				return s, fmt.Errorf("%w: pid %d: %s: %w", ErrProc, pid, key, err)
			}
			if key == "VmRSS" {
				s.RSSBytes, sawRSS = kb*1024, true
			} else {
				s.HWMBytes = kb * 1024
			}
		}
	}
	if !sawRSS {
		return s, fmt.Errorf("%w: pid %d: no VmRSS in status (kernel thread or zombie?)", ErrProc, pid)
	}
	stat, err := fs.ReadFile(fsys, strconv.Itoa(pid)+"/stat")
	if err != nil {
		return s, fmt.Errorf("%w: pid %d: %w", ErrProc, pid, err)
	}
	cpu, err := parseStatCPU(stat)
	if err != nil {
		return s, fmt.Errorf("%w: pid %d: %w", ErrProc, pid, err)
	}
	s.CPU = cpu
	return s, nil
}

// parseKB reads a status value such as "   12345 kB".
func parseKB(val string) (uint64, error) {
	f := strings.Fields(val)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("unexpected value %q", val)
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// parseStatCPU extracts utime+stime from a /proc/<pid>/stat line:
//
//	pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
//	 1    2      3     4    5     6      7    8     9     10     11      12     13     14    15
//
// comm may itself contain spaces and parentheses, so fields are counted from the
// last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no ')' after comm")
	}
	f := strings.Fields(string(stat[i+1:]))
	const utimeIdx = 14 - 3 // f[0] is field 3 (state)
	if len(f) <= utimeIdx+1 {
		return 0, fmt.Errorf("stat: %d fields after comm, want > %d", len(f), utimeIdx+1)
	}
	ut, err := strconv.ParseUint(f[utimeIdx], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: utime: %w", err)
	}
	st, err := strconv.ParseUint(f[utimeIdx+1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: stime: %w", err)
	}
	return time.Duration(ut+st) * (time.Second / userHz), nil
}

// CPUPercent is the CPU the process used between two samples, as a percentage of
// one core (200 means two cores fully busy). Zero when no wall time passed.
func CPUPercent(before, after ProcSample) float64 {
	wall := after.At.Sub(before.At)
	if wall <= 0 {
		return 0
	}
	return 100 * float64(after.CPU-before.CPU) / float64(wall)
}
