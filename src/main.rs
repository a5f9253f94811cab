use clap::Parser;

fn main() {
    portcullis::logging::init();
    let cli = portcullis::cli::Cli::parse();
    if let Err(reason) = portcullis::cli::run(cli) {
        // One line, whatever the reason's source put in it: scripts read the last line.
        let one_line = reason.split_whitespace().collect::<Vec<_>>().join(" ");
        eprintln!("portcullis: {one_line}");
        std::process::exit(1);
    }
}
