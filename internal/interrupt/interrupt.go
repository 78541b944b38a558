// Package interrupt gives commands Ctrl-C handling that ends them within
// a second whatever they are doing: the first Ctrl-C cancels a context
// and abandons the work in progress, the second exits at once.
package interrupt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
)

// ExitCode is the exit status after Ctrl-C (128 + SIGINT).
const ExitCode = 130

// ErrInterrupted is what a command interrupted by Ctrl-C returns.
var ErrInterrupted = errors.New("interrupted")

// Notify returns a context that the first Ctrl-C cancels; the
// second exits the process at once with status 130, whatever it is doing.
func Notify(stderr io.Writer, name string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt)
	go func() {
		select {
		case <-sig:
		case <-ctx.Done():
			return
		}
		cancel()
		<-sig
		fmt.Fprintf(stderr, "%s: interrupted twice, exiting\n", name)
		os.Exit(ExitCode)
	}()
	return ctx, func() { signal.Stop(sig); cancel() }
}

// Run runs f, which reads, decodes, validates and plans, and
// returns its error, or ErrInterrupted as soon as ctx is done: not every
// step of f looks at ctx (a trace's validation, a plan's Check), and
// Ctrl-C must end the command within a second whatever f is doing. f
// goes on in the background until the process exits.
func Run(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return ErrInterrupted
		}
		return err
	case <-ctx.Done():
		return ErrInterrupted
	}
}
