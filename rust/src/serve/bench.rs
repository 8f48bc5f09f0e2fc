//! Bench mode's run and report (vox_serve/bench.py): N requests through the scheduler thread
//! without HTTP, then one line per request, the RTF, and a WAV file per request.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::sched::engine_loop::{EngineLoop, Worker};
use crate::sched::{Event, ReqKey, Request};

/// A request's outcome: its final state and its audio.
pub struct Outcome {
    pub req: Request,
    pub pcm: Vec<u8>,
}

/// Run `requests` to their ends on the calling thread (the replica's scheduler thread); returns
/// them in order with the wall seconds from the first arrival to the last end.
pub fn run<W: Worker>(lp: &mut EngineLoop<W>, requests: Vec<Request>) -> (Vec<Outcome>, f64) {
    let start = Instant::now();
    let mut index: HashMap<ReqKey, usize> = HashMap::new();
    let mut out: Vec<Option<Outcome>> = Vec::with_capacity(requests.len());
    let mut pcm: Vec<Vec<u8>> = vec![Vec::new(); requests.len()];
    let by_id: HashMap<String, usize> = requests.iter().enumerate().map(|(i, r)| (r.req_id.clone(), i)).collect();
    for (i, req) in requests.into_iter().enumerate() {
        let copy = req.clone();
        match lp.scheduler.add_request(req) {
            Ok(key) => {
                index.insert(key, i);
                out.push(None);
            }
            Err(e) => {
                let mut failed = copy;
                failed.finish_reason = Some("error".into());
                failed.error = Some(e.to_string());
                out.push(Some(Outcome { req: failed, pcm: Vec::new() }));
            }
        }
    }
    loop {
        let wait = lp.poll();
        for event in lp.scheduler.events.drain(..) {
            match event {
                Event::Audio { key, pcm: chunk } => pcm[index[&key]].extend_from_slice(&chunk),
                Event::Done(req) => {
                    let i = by_id[&req.req_id];
                    out[i] = Some(Outcome { req: *req, pcm: std::mem::take(&mut pcm[i]) });
                }
            }
        }
        match wait {
            None => break,
            Some(w) if w > 0.0 => std::thread::sleep(Duration::from_secs_f64(w)),
            Some(_) => {}
        }
    }
    if let Some(t) = lp.tracer.as_mut() {
        t.flush();
    }
    let wall = start.elapsed().as_secs_f64();
    (out.into_iter().map(|o| o.expect("every request ends")).collect(), wall)
}

/// A complete WAV file (RIFF, PCM16 mono) around `pcm` (vox_serve/audio.py `wav_bytes`).
pub fn wav_bytes(pcm: &[u8], sample_rate: u32) -> Vec<u8> {
    let data = pcm.len() as u32;
    let mut out = Vec::with_capacity(44 + pcm.len());
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&sample_rate.to_le_bytes());
    out.extend_from_slice(&(sample_rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data.to_le_bytes());
    out.extend_from_slice(pcm);
    out
}

/// The per-request lines and the RTF line on stdout, WAVs in `out_dir`; the exit status (1 when a
/// request failed).
pub fn report(outcomes: &[Outcome], wall: f64, sample_rate: i64, out_dir: Option<&Path>) -> Result<i32, String> {
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--bench-out {}: {e}", dir.display()))?;
    }
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    let mut total_audio = 0.0;
    let _ = writeln!(o, "{:<10} {:>9} {:>10} {:>8} {:>7}  finish", "request", "ttfa_ms", "latency_s", "audio_s", "tokens");
    for Outcome { req, pcm } in outcomes {
        let seconds = pcm.len() as f64 / 2.0 / sample_rate as f64;
        total_audio += seconds;
        let s = &req.stats;
        let ttfa = match s.first_audio {
            Some(t) => format!("{:9.1}", (t - s.arrival) * 1000.0),
            None => format!("{:>9}", "-"),
        };
        let latency = s.finished.unwrap_or(s.arrival) - s.arrival;
        let finish = req.finish_reason.clone().unwrap_or_else(|| "None".into());
        let reason = match &req.error {
            None => finish,
            Some(e) => format!("{finish} ({e})"),
        };
        let _ = writeln!(o, "{:<10} {ttfa} {latency:10.2} {seconds:8.2} {:7}  {reason}", req.req_id,
                         req.counters.num_generated);
        if let Some(dir) = out_dir {
            let path = dir.join(format!("{}.wav", req.req_id));
            std::fs::write(&path, wav_bytes(pcm, sample_rate as u32)).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let _ = writeln!(o, "total audio {total_audio:.2}s in {wall:.2}s wall: RTF {:.2}x real time ({} requests)",
                     total_audio / wall, outcomes.len());
    let _ = o.flush();
    Ok(if outcomes.iter().any(|o| o.req.error.is_some()) { 1 } else { 0 })
}
