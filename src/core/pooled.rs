//! Pooled `process` jobs (`mode = "pooled"`, docs/process-jobs.md "Pooled mode"), the
//! pure parts: the frame that hands a job to a long-lived child on its stdin, the
//! `result` line on fd 3 that ends it, and whether a child takes another job.

/// The first line of a job frame: `job <header bytes> <payload bytes>\n`, then the
/// header (a JSON object of the job's variables) and the payload, back to back.
pub fn job_head(header_len: usize, payload_len: usize) -> String {
    format!("job {header_len} {payload_len}\n")
}

/// A `result <exit code> <output bytes>` line: the job ended with this exit code, and
/// exactly this many bytes of output follow on fd 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultHead {
    pub code: i32,
    pub len: u64,
}

/// A `result` line the worker cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadResult {
    /// Not `result <code> <length>` (a protocol error: the child is recycled).
    Malformed(String),
    /// More output announced than the job type's output cap (a `resource` kill).
    OverCap { len: u64, cap: u64 },
}

/// A control line read as a `result` line: None if it is another kind of line.
pub fn parse_result(line: &str, cap: u64) -> Option<Result<ResultHead, BadResult>> {
    let rest = line.strip_prefix("result")?;
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let head = match fields.as_slice() {
        [code, len] => match (code.parse::<i32>(), len.parse::<u64>()) {
            (Ok(code), Ok(len)) if (0..=255).contains(&code) => ResultHead { code, len },
            _ => return Some(Err(malformed(line))),
        },
        _ => return Some(Err(malformed(line))),
    };
    if head.len > cap {
        return Some(Err(BadResult::OverCap { len: head.len, cap }));
    }
    Some(Ok(head))
}

fn malformed(line: &str) -> BadResult {
    let shown: String = line.chars().take(80).collect();
    BadResult::Malformed(format!("{shown:?} is not `result <exit code 0..255> <output bytes>`"))
}

/// How a pooled job ended, as far as the child's future is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobEnd {
    /// The child answered with a well-formed `result` and its bytes.
    pub answered: bool,
    /// It read the whole job frame from its stdin (else the next frame would be misread).
    pub read_all_input: bool,
    /// Killed for a limit, stopped (cancel, hand-off, stuck) or exited.
    pub ended: bool,
    /// Jobs this child has run, this one included.
    pub jobs: u32,
}

/// Whether a child takes another job: only after a clean answer, under `jobs_per_child`.
pub fn keep_child(end: JobEnd, jobs_per_child: u32) -> bool {
    end.answered && end.read_all_input && !end.ended && end.jobs < jobs_per_child
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn result_lines_are_parsed_and_others_are_not_result_lines() {
        assert_eq!(parse_result("result 0 12", 100), Some(Ok(ResultHead { code: 0, len: 12 })));
        assert_eq!(parse_result("result 65 0", 100), Some(Ok(ResultHead { code: 65, len: 0 })));
        assert_eq!(parse_result("progress 0.5", 100), None);
        assert_eq!(parse_result("resultant 1 2", 100), None);
        assert!(matches!(parse_result("result", 100), Some(Err(BadResult::Malformed(_)))));
        assert!(matches!(parse_result("result x 2", 100), Some(Err(BadResult::Malformed(_)))));
        assert!(matches!(parse_result("result 300 2", 100), Some(Err(BadResult::Malformed(_)))));
        assert!(matches!(parse_result("result 0 -1", 100), Some(Err(BadResult::Malformed(_)))));
        assert_eq!(parse_result("result 0 101", 100), Some(Err(BadResult::OverCap { len: 101, cap: 100 })));
    }

    proptest! {
        #[test]
        fn a_formatted_result_parses_back_and_never_over_the_cap(code in 0i32..=255, len in 0u64..1 << 40, cap in 0u64..1 << 40) {
            let parsed = parse_result(&format!("result {code} {len}"), cap).unwrap();
            if len > cap {
                prop_assert_eq!(parsed, Err(BadResult::OverCap { len, cap }));
            } else {
                prop_assert_eq!(parsed, Ok(ResultHead { code, len }));
            }
        }

        #[test]
        fn a_child_is_kept_only_after_a_clean_answer_and_under_its_job_count(
            answered: bool, read_all_input: bool, ended: bool, jobs in 1u32..10, per_child in 1u32..10,
        ) {
            let end = JobEnd { answered, read_all_input, ended, jobs };
            let kept = keep_child(end, per_child);
            if jobs >= per_child || ended || !answered || !read_all_input {
                prop_assert!(!kept, "{end:?} of {per_child}: a used-up, ended, silent or out-of-step child is recycled");
            } else {
                prop_assert!(kept, "{end:?} of {per_child}: a clean child takes the next job");
            }
        }
    }
}
