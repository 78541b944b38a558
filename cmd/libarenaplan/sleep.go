package main

/*
#include <stdint.h>
void arenaplan_pause_generation_bump(void);
*/
import "C"

import (
	"strings"

	"github.com/arenaplan/arenaplan/bridge"
)

// watchPauses makes every pause and resume of b move
// arenaplan_pause_generation (sleep.c).
func watchPauses(b *bridge.Bridge) {
	b.OnPauseChange(func() { C.arenaplan_pause_generation_bump() })
}

// arenaplan_paused sets *out to the tags paused on device, sorted and
// comma separated ("graphs" for the captured graphs' memory; "" when
// nothing is; free it with arenaplan_free_string). What it answers holds
// while arenaplan_pause_generation keeps the value read before the call:
// a replay asks only when that changed.
//
//export arenaplan_paused
func arenaplan_paused(device C.int, out **C.char) *C.char {
	return reader("arenaplan_paused", func(b *bridge.Bridge) error {
		if out == nil {
			return errNil("arenaplan_paused", "out")
		}
		tags, err := b.Paused(int(device))
		if err != nil {
			return err
		}
		*out = C.CString(strings.Join(tags, ","))
		return nil
	})
}
