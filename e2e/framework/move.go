package framework

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Stream probes a path with new connections back to back until stopped,
// recording every outcome: the tool to see a window where nothing or the
// wrong host answers while a rule changes.
type Stream struct {
	mu      sync.Mutex
	results []Result
	stop    context.CancelFunc
	done    chan struct{}
}

// StartStream starts probing p (each probe waits at most timeout).
func StartStream(ctx context.Context, p Path, timeout time.Duration) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	st := &Stream{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(st.done)
		for ctx.Err() == nil {
			r := Probe(ctx, p.Proto, p.From, p.To, p.Port, timeout)
			if ctx.Err() != nil {
				return // cut short by Stop: not an outcome
			}
			st.mu.Lock()
			st.results = append(st.results, r)
			st.mu.Unlock()
		}
	}()
	return st
}

// Results returns the outcomes so far.
func (st *Stream) Results() []Result {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]Result(nil), st.results...)
}

// CountSince counts the outcomes of probes started at or after t.
func (st *Stream) CountSince(t time.Time) int {
	n := 0
	for _, r := range st.Results() {
		if !r.At.Before(t) {
			n++
		}
	}
	return n
}

// Stop ends the stream and returns every outcome.
func (st *Stream) Stop() []Result {
	st.stop()
	<-st.done
	return st.Results()
}

// Switch summarizes a stream that should move from namespace from to
// namespace to exactly once.
type Switch struct {
	Probes, Before, After int
	// Failed counts probes started after settled that nobody answered;
	// Cut counts unanswered probes started before settled: connections in
	// flight while the rule changed, whose conntrack entries the change
	// removes by design (like upstream's conntrack -D of the EIP). Back
	// counts answers by from after to had answered; Other counts answers
	// by anyone else.
	Failed, Cut, Back, Other int
	// SameTuple counts answers by from after to had answered, started
	// before settled, by a probe whose source port an earlier probe
	// answered by from had used: for UDP that is the same 5-tuple, so
	// conntrack keeps it on the old mapping until the change's conntrack
	// cleanup, which completes before settled. Not a failure; an answer
	// by from on such a tuple after settled is Back.
	SameTuple int
	// FirstNew is when to first answered.
	FirstNew time.Time
	// Errors are the first few failures.
	Errors []string
}

// AnalyzeSwitch classifies a stream's outcomes; settled is when the change
// was confirmed (zero: every unanswered probe is a failure).
func AnalyzeSwitch(rs []Result, from, to string, settled time.Time) Switch {
	var s Switch
	seenNew := false
	byPort := map[uint16]Result{}
	for _, r := range rs {
		prev, reused := byPort[r.ClientPort]
		if r.Err == nil {
			byPort[r.ClientPort] = r
		}
		s.Probes++
		switch {
		case r.Err != nil && !settled.IsZero() && r.At.Before(settled):
			s.Cut++
		case r.Err != nil:
			s.Failed++
			if len(s.Errors) < 3 {
				s.Errors = append(s.Errors, fmt.Sprintf("%s: %v", r.At.Format("15:04:05.000"), r.Err))
			}
		case r.ServerNS == from && seenNew && reused && prev.ServerNS == from && !settled.IsZero() && r.At.Before(settled):
			s.SameTuple++
		case r.ServerNS == from && seenNew:
			s.Back++
			if len(s.Errors) < 3 {
				e := fmt.Sprintf("%s: answered by %s from client port %d", r.At.Format("15:04:05.000"), from, r.ClientPort)
				if reused {
					e += fmt.Sprintf(" (port used before by the probe of %s answered by %s)", prev.At.Format("15:04:05.000"), prev.ServerNS)
				}
				s.Errors = append(s.Errors, e)
			}
		case r.ServerNS == from:
			s.Before++
		case r.ServerNS == to:
			if !seenNew {
				s.FirstNew = r.At
			}
			seenNew = true
			s.After++
		default:
			s.Other++
		}
	}
	return s
}

// OK reports whether the stream moved once with no gap and no overlap.
func (s Switch) OK() error {
	if s.Failed > 0 || s.Cut > 1 || s.Back > 0 || s.Other > 0 || s.Before == 0 || s.After == 0 {
		return fmt.Errorf("switch not clean: %+v", s)
	}
	return nil
}
