package agentapi

import (
	"sync/atomic"
	"time"
)

// releaseIdle is how long Serve waits, after answering a large request
// (WithReleaseMemory), for more input before it returns the memory to the
// system. Returning it at once made the next large request fault all of
// it in again: on this project's VMs a page fault costs several
// microseconds of system time, and a sync of 100k FIPs touches ~100 MB
// (the line, the objects, the engine's index, rendering and batch), so
// back-to-back syncs paid tens of thousands of faults each. Short enough
// that the memory is back well within a second of the last answer.
const releaseIdle = 200 * time.Millisecond

// idleRelease returns the process's free memory to the system (free:
// debug.FreeOSMemory) once Serve has had no input for a while after a
// large request: owe after such an answer, busy when input arrives (it
// postpones an owed release), idle after any other answer (it waits
// again for an owed one). At most one release runs at a time.
type idleRelease struct {
	free    func()
	wait    time.Duration
	timer   *time.Timer
	owed    atomic.Bool
	running atomic.Bool
}

func newIdleRelease(wait time.Duration, free func()) *idleRelease {
	r := &idleRelease{free: free, wait: wait}
	r.timer = time.AfterFunc(time.Hour, r.fire)
	r.timer.Stop()
	return r
}

// owe records a large request's answer and starts the wait.
func (r *idleRelease) owe() {
	r.owed.Store(true)
	r.timer.Reset(r.wait)
}

// busy postpones an owed release: input arrived.
func (r *idleRelease) busy() { r.timer.Stop() }

// idle starts the wait again after an answer, when a release is owed.
func (r *idleRelease) idle() {
	if r.owed.Load() {
		r.timer.Reset(r.wait)
	}
}

// stop cancels a release not yet begun (Serve returns).
func (r *idleRelease) stop() { r.timer.Stop() }

// fire runs on the timer's goroutine.
func (r *idleRelease) fire() {
	if !r.running.CompareAndSwap(false, true) {
		return // the running one takes it
	}
	defer r.running.Store(false)
	if r.owed.CompareAndSwap(true, false) {
		r.free()
	}
}
