package cuda

import (
	"errors"
	"testing"
)

func TestSimForeign(t *testing.T) {
	s, err := OpenSim(SimConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	own, err := s.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if own.Handle() == 0 {
		t.Fatal("NewStream gave handle 0, the legacy stream's")
	}
	got, err := s.Foreign(own.Handle())
	if err != nil || got != own {
		t.Fatalf("Foreign(own handle) = %v, %v; want the stream NewStream made", got, err)
	}
	a, _ := s.Foreign(0x1234)
	b, _ := s.Foreign(0x1234)
	if a != b || a.Handle() != 0x1234 {
		t.Fatalf("Foreign(0x1234) twice: %v and %v; want one stream with that handle", a, b)
	}
	var ce *Error
	if err := a.Close(); !errors.As(err, &ce) || ce.Code != ErrorNotPermitted {
		t.Fatalf("Close of a foreign stream: %v; want ErrorNotPermitted", err)
	}
	// A foreign stream captures like any other.
	if err := s.BeginCapture(a, CaptureModeGlobal); err != nil {
		t.Fatal(err)
	}
	if info, err := s.CaptureInfo(a); err != nil || info.Status != CaptureActive {
		t.Fatalf("CaptureInfo of a capturing foreign stream: %+v, %v", info, err)
	}
	g, err := s.EndCapture(a)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	legacy, err := s.Foreign(0)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.CaptureInfo(legacy); err != nil || info.Status != CaptureNone {
		t.Fatalf("CaptureInfo(legacy) = %+v, %v; want NONE", info, err)
	}
	if err := s.BeginCapture(legacy, CaptureModeGlobal); !errors.As(err, &ce) || ce.Code != ErrorStreamCaptureUnsupported {
		t.Fatalf("BeginCapture(legacy) = %v; want ErrorStreamCaptureUnsupported", err)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	if again, _ := s.Foreign(own.Handle()); again == own {
		t.Fatal("Foreign returned a closed stream")
	}
}
