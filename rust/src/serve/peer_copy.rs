//! The hand-over of a disaggregated engine on two GPUs (`driver/disagg.rs`): a device-to-device copy
//! on the codec half's stream, ordered behind the LM half's gathers by an event, and the LM half's
//! next gathers ordered behind the copy by another. Never through the host.

use crate::cuda::{self, CudaError, Event};
use crate::driver::HandoverCopy;

fn err(e: CudaError) -> String {
    e.0
}

pub struct PeerCopy {
    lm_device: i32,
    lm_stream: u64,
    codec_device: i32,
    codec_stream: u64,
    /// Recorded on the LM stream behind the gathers.
    gathered: Event,
    /// Recorded on the codec stream behind the copy.
    copied: Event,
}

impl PeerCopy {
    /// Between the LM half's launch stream and the codec half's; enables the codec device's access to
    /// the LM device's memory where the hardware allows it (else the driver stages the copy). Two halves
    /// on one device (a test's) need no peer access.
    pub fn new(lm_device: i32, lm_stream: u64, codec_device: i32, codec_stream: u64) -> Result<PeerCopy, String> {
        if codec_device != lm_device && !cuda::enable_peer_access(codec_device, lm_device).map_err(err)? {
            eprintln!("vox-serve: warning: cuda:{codec_device} cannot read cuda:{lm_device} directly: the driver \
                       stages the hand-over copy");
        }
        Ok(PeerCopy { lm_device, lm_stream, codec_device, codec_stream,
                      gathered: Event::new(lm_device, false).map_err(err)?,
                      copied: Event::new(codec_device, false).map_err(err)? })
    }
}

impl HandoverCopy for PeerCopy {
    fn before_gather(&mut self) -> Result<(), String> {
        cuda::stream_wait_event(self.lm_device, self.lm_stream, &self.copied).map_err(err)
    }

    fn gathered(&mut self) -> Result<(), String> {
        self.gathered.record(self.lm_stream).map_err(err)
    }

    fn copy(&mut self, dst: u64, src: u64, nbytes: usize) -> Result<(), String> {
        cuda::stream_wait_event(self.codec_device, self.codec_stream, &self.gathered).map_err(err)?;
        cuda::memcpy_peer_async(self.codec_device, dst, self.lm_device, src, nbytes, self.codec_stream)
            .map_err(err)?;
        self.copied.record(self.codec_stream).map_err(err)
    }
}
