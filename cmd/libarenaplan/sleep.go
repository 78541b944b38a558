package main

/*
#include <stdint.h>
void arenaplan_pause_generation_bump(void);
*/
import "C"

import (
	"errors"
	"strings"
	"sync"

	"github.com/arenaplan/arenaplan/bridge"
)

// watchOnce installs, at the first arenaplan_paused, the hook that moves
// arenaplan_pause_generation (sleep.c) on every pause and resume.
var watchOnce sync.Once

// arenaplan_paused sets *out to the tags paused on device, sorted and
// comma separated ("graphs" for the captured graphs' memory; "" when
// nothing is; free it with arenaplan_free_string). What it answers holds
// while arenaplan_pause_generation keeps the value read before the call:
// a replay asks only when that changed.
//
//export arenaplan_paused
func arenaplan_paused(device C.int, out **C.char) *C.char {
	if out == nil {
		return cerr(errors.New("arenaplan: arenaplan_paused: out is NULL"))
	}
	return bridgeCall(func(b *bridge.Bridge) error {
		watchOnce.Do(func() { b.OnPauseChange(func() { C.arenaplan_pause_generation_bump() }) })
		tags, err := b.Paused(int(device))
		if err != nil {
			return err
		}
		*out = C.CString(strings.Join(tags, ","))
		return nil
	})
}
