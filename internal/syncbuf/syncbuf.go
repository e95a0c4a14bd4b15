// Package syncbuf is a bytes.Buffer that several goroutines may write and
// read at once: the collector of a child process's stderr while the parent
// reads it for error messages.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a goroutine-safe byte buffer. The zero value is an empty buffer
// without a bound.
type Buffer struct {
	// Max, when positive, bounds the buffer: a write that finds more than
	// Max bytes held first drops them, so a long-running child's log keeps
	// only its recent part.
	Max int

	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Max > 0 && l.b.Len() > l.Max {
		l.b.Reset()
	}
	return l.b.Write(p)
}

// String returns what the buffer holds.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Len returns how many bytes the buffer holds.
func (l *Buffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}
