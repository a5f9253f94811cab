use clap::Parser;

fn main() {
    portcullis::init_logging();
    let cli = portcullis::Cli::parse();
    if let Err(reason) = portcullis::run(cli) {
        // One line, whatever the reason's source put in it: scripts read the last line.
        let one_line = reason.split_whitespace().collect::<Vec<_>>().join(" ");
        eprintln!("portcullis: {one_line}");
        std::process::exit(1);
    }
}
