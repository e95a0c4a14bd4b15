// Package progress shows on the terminal what a benchmark run is doing:
// which scenario, which size, how far.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Printer writes progress lines. On a terminal the current step is redrawn
// in place; otherwise each step is printed as its own line, at most every
// few seconds for repeated updates. Safe for concurrent use; a nil Printer
// prints nothing.
type Printer struct {
	mu       sync.Mutex
	w        io.Writer
	tty      bool
	start    time.Time
	scenario string
	lastLine time.Time
	width    int
}

// New returns a Printer writing to w; tty says whether to redraw in place.
func New(w io.Writer, tty bool) *Printer {
	return &Printer{w: w, tty: tty, start: time.Now()}
}

// Stderr returns a Printer on standard error, redrawing when it is a
// terminal.
func Stderr() *Printer {
	_, err := unix.IoctlGetTermios(int(os.Stderr.Fd()), unix.TCGETS)
	return New(os.Stderr, err == nil)
}

// Scenario starts a new scenario: it is printed on its own line.
func (p *Printer) Scenario(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scenario = fmt.Sprintf(format, args...)
	p.clear()
	fmt.Fprintf(p.w, "[%s] == %s\n", p.elapsed(), p.scenario)
}

// Step reports the current step (e.g. "(a) iptables-legacy script N=10k
// preload"). done/total, when total > 0, is shown as a count.
func (p *Printer) Step(done, total int, format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if total > 0 {
		msg = fmt.Sprintf("%s  %d/%d", msg, done, total)
	}
	line := fmt.Sprintf("[%s]    %s", p.elapsed(), msg)
	if p.tty {
		pad := ""
		if n := p.width - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		fmt.Fprintf(p.w, "\r%s%s", line, pad)
		p.width = len(line)
		return
	}
	// Not a terminal: print the first and last update of a step and
	// otherwise at most one line every 5 seconds.
	if total > 0 && done != 0 && done != total && time.Since(p.lastLine) < 5*time.Second {
		return
	}
	p.lastLine = time.Now()
	fmt.Fprintln(p.w, line)
}

// Printf prints a message on its own line (e.g. a result or a warning).
func (p *Printer) Printf(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintf(p.w, "[%s]    %s\n", p.elapsed(), fmt.Sprintf(format, args...))
}

// clear ends a line being redrawn.
func (p *Printer) clear() {
	if p.tty && p.width > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
		p.width = 0
	}
}

func (p *Printer) elapsed() string {
	d := time.Since(p.start).Round(time.Second)
	return fmt.Sprintf("%02d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}
